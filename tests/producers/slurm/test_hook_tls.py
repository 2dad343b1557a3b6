"""The Slurm hook's own (standard-library) Kafka client over TLS: with security_protocol=SSL
it sends through the broker's mutual-TLS listener with the same CA/cert/key variables the
aiokafka clients read; with SASL, or a TLS file it cannot load, it says so in one log line,
spools the event for the drainer and still exits 0 (the hook never fails a job)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from gpugap.groundfloor.settings import KafkaSettings
from gpugap.producers.slurm import spool
from gpugap.producers.slurm.hook import HookConfig
from gpugap.producers.slurm.hook_command import run
from gpugap.schemas.topics import SLURM_JOBS
from tests.harness.kafka_tls import TlsBroker
from tests.harness.topics import read_topic
from tests.producers.slurm.test_parse import env_file

pytestmark = pytest.mark.kafka


def hook_env(
    broker: TlsBroker, kafka: KafkaSettings, tmp_path: Path, **extra: str
) -> dict[str, str]:
    return {
        **broker.env(),
        "GPUGAP_KAFKA_TOPIC_PREFIX": kafka.topic_prefix,
        "GPUGAP_SLURM_SPOOL_DIR": str(tmp_path / "spool"),
        "GPUGAP_SLURM_CLUSTER": "probe",
        **extra,
    }


def hook_log(tmp_path: Path) -> str:
    path = tmp_path / "spool" / "hook.log"
    return path.read_text() if path.exists() else ""


def test_hook_tls_config_reads_what_settings_read(kafka_tls_broker: TlsBroker) -> None:
    env = kafka_tls_broker.env()
    k, h = kafka_tls_broker.settings(), HookConfig(env)
    assert (h.protocol, h.ssl_cafile, h.ssl_certfile, h.ssl_keyfile) == (
        k.security_protocol,
        str(k.ssl_cafile),
        str(k.ssl_certfile),
        str(k.ssl_keyfile),
    )
    assert h.ssl_check_hostname is k.ssl_check_hostname is True
    off = HookConfig({**env, "GPUGAP_KAFKA_SSL_CHECK_HOSTNAME": "false"}).tls_context()
    assert off is not None and not off.check_hostname
    assert HookConfig({}).tls_context() is None and HookConfig({}).unsupported() is None


def test_hook_sends_over_mutual_tls(
    kafka_tls: KafkaSettings, kafka_tls_broker: TlsBroker, tmp_path: Path
) -> None:
    pw_file = tmp_path / "key-password"
    pw_file.write_text(kafka_tls_broker.pki.key_password + "\n")
    env = hook_env(kafka_tls_broker, kafka_tls, tmp_path)
    assert run({**env_file("env_jobcomp_failed.env"), **env}) == "sent"
    env.pop("GPUGAP_KAFKA_SSL_KEY_PASSWORD")  # the password from a file works the same
    env["GPUGAP_KAFKA_SSL_KEY_PASSWORD_FILE"] = str(pw_file)
    assert run({**env_file("env_jobcomp_completed.env"), **env}) == "sent"
    events = asyncio.run(read_topic(kafka_tls, SLURM_JOBS, 2, settle_s=1))
    assert {e.state.value for e in events} == {"FAILED", "COMPLETED"}
    assert {e.source for e in events} == {"hook"}
    assert not spool.pending(str(tmp_path / "spool")) and hook_log(tmp_path) == ""


def test_hook_spools_with_one_clear_line_when_it_cannot_speak_the_protocol(
    kafka_tls: KafkaSettings, kafka_tls_broker: TlsBroker, tmp_path: Path
) -> None:
    env = hook_env(kafka_tls_broker, kafka_tls, tmp_path, GPUGAP_KAFKA_SECURITY_PROTOCOL="SASL_SSL")
    assert run({**env_file("env_jobcomp_failed.env"), **env}) == "spooled"
    log = hook_log(tmp_path)
    assert "GPUGAP_KAFKA_SECURITY_PROTOCOL=SASL_SSL" in log and "PLAINTEXT and SSL only" in log
    assert "gpugap slurm-hook drain" in log and len(log.splitlines()) == 1
    assert len(spool.pending(str(tmp_path / "spool"))) == 1


def test_hook_spools_when_a_tls_file_is_bad_or_the_ca_is_wrong(
    kafka_tls: KafkaSettings, kafka_tls_broker: TlsBroker, tmp_path: Path
) -> None:
    pki = kafka_tls_broker.pki
    cases = {
        "missing CA": {"GPUGAP_KAFKA_SSL_CAFILE": str(tmp_path / "nope.pem")},
        "no key password": {"GPUGAP_KAFKA_SSL_KEY_PASSWORD": ""},
        "wrong CA": {"GPUGAP_KAFKA_SSL_CAFILE": str(pki.other_ca)},
        "no client cert": {"GPUGAP_KAFKA_SSL_CERTFILE": "", "GPUGAP_KAFKA_SSL_KEYFILE": ""},
    }
    for extra in cases.values():
        env = hook_env(kafka_tls_broker, kafka_tls, tmp_path, **extra)
        assert run({**env_file("env_jobcomp_failed.env"), **env}) == "spooled"
    lines = hook_log(tmp_path).splitlines()
    assert len(lines) == len(cases)
    missing, no_pw, wrong_ca, _ = lines
    assert f"cannot load GPUGAP_KAFKA_SSL_CAFILE={tmp_path / 'nope.pem'}" in missing
    assert "cannot load GPUGAP_KAFKA_SSL_CERTFILE" in no_pw and pki.key_password not in no_pw
    assert "an encrypted key needs GPUGAP_KAFKA_SSL_KEY_PASSWORD" in no_pw
    assert "TLS handshake" in wrong_ca and "CERTIFICATE_VERIFY_FAILED" in wrong_ca
    assert len(spool.pending(str(tmp_path / "spool"))) == 1  # one event, one file (event_id)


def test_hook_process_exits_0_and_plaintext_does_not_import_ssl(
    kafka_tls: KafkaSettings, kafka_tls_broker: TlsBroker, tmp_path: Path
) -> None:
    """`gpugap slurm-hook` as slurmctld runs it: SASL spools and exits 0; a PLAINTEXT hook
    keeps its start-up cost (the ssl module is imported only for SSL)."""
    gpugap = Path(sys.executable).with_name("gpugap")
    job = env_file("env_jobcomp_failed.env")
    sasl = hook_env(
        kafka_tls_broker, kafka_tls, tmp_path, GPUGAP_KAFKA_SECURITY_PROTOCOL="SASL_SSL"
    )
    out = subprocess.run(
        [sys.executable, str(gpugap), "slurm-hook"],
        env={"PATH": "/usr/bin:/bin", **job, **sasl},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 0 and "PLAINTEXT and SSL only" in out.stderr
    plain = {
        "PATH": "/usr/bin:/bin",
        **job,
        "GPUGAP_KAFKA_BOOTSTRAP": "127.0.0.1:1",  # refused at once: spooled
        "GPUGAP_SLURM_SPOOL_DIR": str(tmp_path / "spool-plain"),
    }
    out = subprocess.run(
        [sys.executable, "-X", "importtime", str(gpugap), "slurm-hook"],
        env=plain,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 0
    loaded = {line.split("|")[-1].strip() for line in out.stderr.splitlines() if "|" in line}
    assert "gpugap.producers.slurm.wire" in loaded and "ssl" not in loaded
