"""Kafka over TLS: KafkaSettings builds one TLS context from the CA/cert/key files, every
aiokafka client and the Faust app get it, and a bad file is a clear configuration error.

The broker tests run against a real broker whose SSL listener requires a client certificate
(tests/harness/kafka_tls.py): a client that did not get the context, or got a wrong one, cannot talk
to it at all.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpugap.cli import main
from gpugap.groundfloor.kafka.consume import DeadLetters, RawMessage, consume
from gpugap.groundfloor.kafka.publish import KafkaPublisher
from gpugap.groundfloor.settings import KafkaSettings, Settings, load
from gpugap.schemas import TOPICS, Record
from gpugap.schemas.errors import ConfigError, RetriableError
from gpugap.schemas.examples import node_samples
from gpugap.schemas.topics import MINUTES, SAMPLES
from gpugap.services.kafka import broker_ready
from tests.harness.commands import run_gpugap
from tests.harness.kafka_tls import Pki, TlsBroker, make_pki
from tests.harness.topics import create_topics, read_topic


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for k in list(os.environ):
        if k.startswith("GPUGAP_"):
            monkeypatch.delenv(k)
    yield monkeypatch


def _ca_names(ctx: ssl.SSLContext) -> set[str]:
    certs: list[Any] = ctx.get_ca_certs()
    return {v for c in certs for rdn in c["subject"] for k, v in rdn if k == "commonName"}


# --- configuration (no broker) ----------------------------------------------------------------


def test_ssl_with_a_ca_file_that_does_not_exist_is_a_clear_config_error(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-ca.pem"
    with pytest.raises(ConfigError, match=f"cannot read GPUGAP_KAFKA_SSL_CAFILE={missing}"):
        KafkaSettings(security_protocol="SSL", ssl_cafile=missing)
    clean_env.setenv("GPUGAP_KAFKA_SECURITY_PROTOCOL", "SSL")
    clean_env.setenv("GPUGAP_KAFKA_SSL_CAFILE", str(missing))
    with pytest.raises(ConfigError, match="No such file or directory"):
        load()
    assert main(["config", "show"]) == 2  # what every command does with it: one clear line
    err = capsys.readouterr().err
    assert f"cannot read GPUGAP_KAFKA_SSL_CAFILE={missing}: No such file or directory" in err
    clean_env.setenv("GPUGAP_KAFKA_SSL_CAFILE", str(tmp_path))
    with pytest.raises(ConfigError, match="is a directory"):
        load()


def test_tls_files_without_a_tls_protocol_and_a_key_without_a_cert_are_refused(
    clean_env: pytest.MonkeyPatch, pki: Pki
) -> None:
    # fail closed: a CA given with PLAINTEXT means TLS was meant; never connect in the clear
    for protocol in ("PLAINTEXT", "SASL_PLAINTEXT"):
        with pytest.raises(ConfigError, match="GPUGAP_KAFKA_SSL_CAFILE set but"):
            KafkaSettings(security_protocol=protocol, ssl_cafile=pki.ca)
    with pytest.raises(ConfigError, match="GPUGAP_KAFKA_SSL_KEYFILE needs"):
        KafkaSettings(security_protocol="SSL", ssl_cafile=pki.ca, ssl_keyfile=pki.client_key)


def test_a_bad_key_or_password_is_a_clear_config_error(pki: Pki) -> None:
    base = {"security_protocol": "SSL", "ssl_cafile": pki.ca, "ssl_certfile": pki.client_cert}
    no_pw = KafkaSettings(**base, ssl_keyfile=pki.client_key)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="encrypted key needs GPUGAP_KAFKA_SSL_KEY_PASSWORD"):
        no_pw.client_options()  # and no interactive prompt: the test would hang
    wrong = KafkaSettings(**base, ssl_keyfile=pki.client_key, ssl_key_password="not-it")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="Kafka TLS: cannot load GPUGAP_KAFKA_SSL_CERTFILE") as e:
        wrong.client_options()
    assert "not-it" not in str(e.value)
    mismatch = KafkaSettings(**base, ssl_keyfile=pki.server_key)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="KEYFILE"):
        mismatch.client_options()
    not_pem = KafkaSettings(security_protocol="SSL", ssl_cafile=pki.client_key)
    with pytest.raises(ConfigError, match="Kafka TLS: cannot load GPUGAP_KAFKA_SSL_CAFILE"):
        not_pem.client_options()


def test_client_options_carry_the_tls_context_and_config_show_masks_the_key_password(
    clean_env: pytest.MonkeyPatch, pki: Pki, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "ssl_context" not in KafkaSettings().client_options()
    pw_file = tmp_path / "key-password"
    pw_file.write_text(pki.key_password + "\n")
    env = {
        "GPUGAP_KAFKA_SECURITY_PROTOCOL": "SSL",
        "GPUGAP_KAFKA_SSL_CAFILE": str(pki.ca),
        "GPUGAP_KAFKA_SSL_CERTFILE": str(pki.client_cert),
        "GPUGAP_KAFKA_SSL_KEYFILE": str(pki.client_key),
        "GPUGAP_KAFKA_SSL_KEY_PASSWORD_FILE": str(pw_file),
    }
    for k, v in env.items():
        clean_env.setenv(k, v)
    kafka = load().kafka
    assert kafka.ssl_key_password is not None
    assert kafka.ssl_key_password.get_secret_value() == pki.key_password
    opts = kafka.client_options()
    ctx = opts["ssl_context"]
    assert opts["security_protocol"] == "SSL" and isinstance(ctx, ssl.SSLContext)
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert _ca_names(ctx) == {"gpugap test ca"}  # the given CA, not the system's
    assert pki.key_password not in repr(kafka)
    assert main(["config", "show"]) == 0
    out = capsys.readouterr().out
    assert pki.key_password not in out
    shown = json.loads(out)["kafka"]
    assert shown["ssl_key_password"] == "**********"
    assert shown["ssl_cafile"] == str(pki.ca)

    clean_env.setenv("GPUGAP_KAFKA_SSL_CHECK_HOSTNAME", "false")
    ctx = load().kafka.client_options()["ssl_context"]
    assert not ctx.check_hostname and ctx.verify_mode == ssl.CERT_REQUIRED  # still verified
    sasl = KafkaSettings(
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="u",
        sasl_password="p",
        ssl_cafile=pki.ca,
    ).client_options()
    assert sasl["security_protocol"] == "SASL_SSL" and _ca_names(sasl["ssl_context"])
    # no CA file: the system CAs (a broker with a public certificate)
    assert KafkaSettings(security_protocol="SSL").client_options()["ssl_context"] is not None


def test_the_faust_app_gets_the_same_credentials(pki: Pki) -> None:
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    from gpugap.streams.app import _credentials

    def auth(**kw: object) -> dict[str, object]:
        kafka = KafkaSettings(**kw)  # type: ignore[arg-type]
        return dict(credentials_to_aiokafka_auth(_credentials(kafka)))

    tls: dict[str, object] = {
        "ssl_cafile": pki.ca,
        "ssl_certfile": pki.client_cert,
        "ssl_keyfile": pki.client_key,
        "ssl_key_password": pki.key_password,
    }
    got = auth(security_protocol="SSL", **tls)
    assert got["security_protocol"] == "SSL" and _ca_names(got["ssl_context"])  # type: ignore[arg-type]
    got = auth(security_protocol="SASL_SSL", sasl_username="u", sasl_password="p", **tls)
    assert (got["security_protocol"], got["sasl_mechanism"]) == ("SASL_SSL", "PLAIN")
    assert got["sasl_plain_password"] == "p" and _ca_names(got["ssl_context"])  # type: ignore[arg-type]
    got = auth(security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256")
    assert (got["security_protocol"], got["sasl_mechanism"]) == ("SASL_PLAINTEXT", "SCRAM-SHA-256")
    assert got["ssl_context"] is None
    assert auth() == {"security_protocol": "PLAINTEXT"}


# --- against the broker's mutual-TLS listener --------------------------------------------------


@pytest.mark.kafka
def test_publisher_admin_and_consumer_round_trip_over_mutual_tls(
    kafka_tls: KafkaSettings, kafka_tls_broker: TlsBroker
) -> None:
    sent = list(node_samples(20, nodes=4, gpus=2))
    got: list[Record] = []
    stop = asyncio.Event()

    async def handler(batch: Sequence[tuple[RawMessage, Record]]) -> bool:
        got.extend(r for _, r in batch)
        if len(got) >= len(sent):
            stop.set()
        return True

    async def scenario() -> None:
        await create_topics(kafka_tls, [SAMPLES.name], partitions=2)  # the admin client
        async with KafkaPublisher(kafka_tls) as pub:
            for record in sent:
                await pub.send(SAMPLES, record)
            dead = DeadLetters(pub, "tls", kafka_tls.topic_prefix)
            await asyncio.wait_for(
                consume(kafka_tls, "tls", handler, dead, topics=[SAMPLES.name], stop=stop), 60
            )

    asyncio.run(scenario())
    assert sorted(map(repr, got)) == sorted(map(repr, sent))
    assert broker_ready(kafka_tls)  # the readiness probe with the settings' TLS options
    assert not broker_ready(kafka_tls_broker.ssl_bootstrap)  # plaintext to a TLS port: no


@pytest.mark.kafka
def test_clients_without_the_right_ca_or_certificate_are_refused(
    kafka_tls_broker: TlsBroker,
) -> None:
    pki = kafka_tls_broker.pki
    untrusted = kafka_tls_broker.settings(ssl_cafile=pki.other_ca)  # the broker's CA unknown
    anonymous = kafka_tls_broker.settings(ssl_certfile=None, ssl_keyfile=None)  # no client cert

    async def start(kafka: KafkaSettings) -> None:
        async with KafkaPublisher(kafka):
            pass

    for kafka in (untrusted, anonymous):
        with pytest.raises(RetriableError, match="cannot reach Kafka"):
            asyncio.run(asyncio.wait_for(start(kafka), 60))


@pytest.mark.kafka
def test_workers_run_over_mutual_tls(kafka_tls: KafkaSettings, kafka_tls_broker: TlsBroker) -> None:
    """Every client a worker makes (Faust's consumer and producer, the runtime's own
    consumers, admin and state producer, the publisher) reaches the mTLS listener: one
    without the TLS context could not connect at all."""
    from gpugap.producers.base import run_producer
    from gpugap.simulator.simulator import Simulator
    from tests.harness.topics import create_topics as create_worker_topics

    async def feed() -> None:
        await create_worker_topics(kafka_tls, list(TOPICS))
        sim = Simulator(Settings(kafka=kafka_tls), "small", speed=None, duration=600)
        await run_producer(sim, KafkaPublisher(kafka_tls))

    asyncio.run(feed())
    # as ``gpugap worker`` runs it, from the environment
    env = {
        **os.environ,
        **kafka_tls_broker.env(),
        "GPUGAP_KAFKA_TOPIC_PREFIX": kafka_tls.topic_prefix,
        "GPUGAP_LOG_LEVEL": "WARNING",
    }
    cmd = ["worker", "--http", "", "--idle-flush", "1", "--idle-timeout", "3", "--backfill"]
    done = run_gpugap(cmd, env)
    assert "gpu.minutes.v1:" in done.stderr
    minutes = asyncio.run(read_topic(kafka_tls, MINUTES, 1))
    assert any(m.allocation_id is not None for m in minutes)  # samples joined to jobs
    # the state written (Faust: the state topic, by the worker's own producer)
    assert _state_records(kafka_tls) > 0


def _state_records(kafka: KafkaSettings) -> int:
    """Records in the worker's state topic (``<group>-state-changelog``), read over TLS."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    async def count() -> int:
        admin = AIOKafkaAdminClient(**kafka.client_options())
        await admin.start()
        try:
            names = [
                t
                for t in await admin.list_topics()
                if t.startswith(kafka.topic_prefix) and t.endswith("-state-changelog")
            ]
        finally:
            await admin.close()
        consumer = AIOKafkaConsumer(**kafka.client_options())
        await consumer.start()
        try:
            tps = [TopicPartition(n, 0) for n in names]
            ends = await consumer.end_offsets(tps) if tps else {}
        finally:
            await consumer.stop()
        return sum(ends.values())

    return asyncio.run(count())
