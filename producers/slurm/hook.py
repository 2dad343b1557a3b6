"""The Slurm hook's work (see hook_command.py): the start and end events, the send to
Kafka under one deadline, the spool. Standard library only."""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import time
from collections.abc import Mapping, Sequence

from gpugap.producers.slurm import event, show, spool, wire
from gpugap.producers.slurm.parse import ParseError, jobcomp_env

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hook's start-up)
if TYPE_CHECKING:
    import ssl
    from typing import Any

BACKLOG_PER_HOOK = 50  # spooled events a hook ships after its own (bounded by the deadline)
DEFAULT_TIMEOUT_S = 2.0


class HookConfig:
    """The environment variables ``SlurmSettings``/``KafkaSettings`` read, read without them.
    Never raises: a value it cannot use is a line in ``problems`` and the default is taken
    (the hook then spools instead of sending, see producers/slurm/hook_command.py)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.problems: list[str] = []
        self.cluster = env.get("GPUGAP_SLURM_CLUSTER") or env.get("GPUGAP_CLUSTER") or None
        self.spool_dir = env.get("GPUGAP_SLURM_SPOOL_DIR") or "/var/spool/gpugap/slurm"
        self.timeout_s = self._seconds(env, "GPUGAP_SLURM_HOOK_TIMEOUT_S", DEFAULT_TIMEOUT_S)
        self.scontrol = env.get("GPUGAP_SLURM_SCONTROL") or "scontrol"
        self.end_hook = env.get("GPUGAP_SLURM_END_HOOK") or "jobcomp"
        if self.end_hook not in ("jobcomp", "epilog"):
            self.problems.append(
                f"GPUGAP_SLURM_END_HOOK={self.end_hook!r} is neither 'jobcomp' nor 'epilog'"
            )
        self.bootstrap = env.get("GPUGAP_KAFKA_BOOTSTRAP") or "127.0.0.1:9092"
        self.topic_prefix = env.get("GPUGAP_KAFKA_TOPIC_PREFIX") or ""
        self.protocol = env.get("GPUGAP_KAFKA_SECURITY_PROTOCOL") or "PLAINTEXT"
        self.plaintext = self.protocol == "PLAINTEXT"
        self.client_id = env.get("GPUGAP_KAFKA_CLIENT_ID") or "gpugap-slurm-hook"
        # TLS (protocol SSL), from the same files the aiokafka clients use (KafkaSettings)
        self.ssl_cafile = env.get("GPUGAP_KAFKA_SSL_CAFILE") or None
        self.ssl_certfile = env.get("GPUGAP_KAFKA_SSL_CERTFILE") or None
        self.ssl_keyfile = env.get("GPUGAP_KAFKA_SSL_KEYFILE") or None
        self._key_password = env.get("GPUGAP_KAFKA_SSL_KEY_PASSWORD") or None
        self._key_password_file = env.get("GPUGAP_KAFKA_SSL_KEY_PASSWORD_FILE") or None
        check = (env.get("GPUGAP_KAFKA_SSL_CHECK_HOSTNAME") or "true").strip().lower()
        self.ssl_check_hostname = check not in ("0", "false", "no", "off", "f", "n")

    def _seconds(self, env: Mapping[str, str], name: str, default: float) -> float:
        raw = env.get(name) or ""
        try:
            value = float(raw) if raw else default
        except ValueError:
            value = -1.0
        if not 0 < value < 3600:  # also NaN
            self.problems.append(
                f"{name}={raw!r} is not a number of seconds (e.g. 2 or 0.5); using {default}"
            )
            return default
        return value

    def unsupported(self) -> str | None:
        """Why the hook's own client cannot reach this Kafka (None: it can)."""
        if self.protocol in ("PLAINTEXT", "SSL"):
            return None
        return (
            f"GPUGAP_KAFKA_SECURITY_PROTOCOL={self.protocol}: the hook's built-in Kafka client "
            "speaks PLAINTEXT and SSL only (no SASL); events are spooled for "
            "`gpugap slurm-hook drain` (or the poller) to ship"
        )

    def tls_context(self) -> ssl.SSLContext | None:
        """The ``ssl.SSLContext`` for protocol SSL (else None): KafkaSettings.ssl_context()
        in the standard library. Raises WireError, naming the variable, on a bad file."""
        if self.protocol != "SSL":
            return None
        import ssl

        if self.ssl_keyfile and not self.ssl_certfile:
            raise wire.WireError("GPUGAP_KAFKA_SSL_KEYFILE needs GPUGAP_KAFKA_SSL_CERTFILE")
        what = f"GPUGAP_KAFKA_SSL_CAFILE={self.ssl_cafile}" if self.ssl_cafile else "system CAs"
        hint = ""
        try:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ssl_cafile)
            if self.ssl_certfile:
                password = self._key_password
                if password is None and self._key_password_file:
                    what = f"GPUGAP_KAFKA_SSL_KEY_PASSWORD_FILE={self._key_password_file}"
                    with open(self._key_password_file) as fh:
                        password = fh.read().strip()
                what = f"GPUGAP_KAFKA_SSL_CERTFILE={self.ssl_certfile}" + (
                    f", GPUGAP_KAFKA_SSL_KEYFILE={self.ssl_keyfile}" if self.ssl_keyfile else ""
                )
                if not password:
                    hint = " (an encrypted key needs GPUGAP_KAFKA_SSL_KEY_PASSWORD)"
                # no password: fail, never OpenSSL's prompt on slurmctld's terminal
                ctx.load_cert_chain(self.ssl_certfile, self.ssl_keyfile, password or _no_password)
        except ssl.SSLError as exc:
            raise wire.WireError(f"Kafka TLS: cannot load {what}: {exc}{hint}") from None
        except OSError as exc:
            raise wire.WireError(f"Kafka TLS: cannot load {what}: {exc.strerror or exc}") from None
        ctx.check_hostname = self.ssl_check_hostname  # verify_mode stays CERT_REQUIRED
        return ctx


def _no_password() -> str:
    return ""


def log(cfg: HookConfig, msg: str) -> None:
    """One line to stderr and to <spool>/hook.log (slurmctld discards the hook's output).
    A hook.log that is a symbolic link (or a FIFO, a hard link, another user's file) is never
    written through: the line goes to stderr only, with why."""
    line = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} gpugap slurm-hook[{os.getpid()}]: {msg}\n"
    sys.stderr.write(line)
    try:
        spool.private_dir(cfg.spool_dir)
        path = os.path.join(cfg.spool_dir, "hook.log")
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and st.st_size > 4 << 20:
                os.replace(path, path + ".1")  # renames a link itself, never its target
        with open(spool.open_private(path, os.O_WRONLY | os.O_APPEND), "a") as fh:
            fh.write(line.encode("utf-8", "replace").decode())
    except spool.UnsafeSpool as exc:
        sys.stderr.write(f"gpugap slurm-hook[{os.getpid()}]: not logged to the spool: {exc}\n")
    except OSError:
        pass


def cluster_of(cfg: HookConfig, env: Mapping[str, str], start: dict[str, Any] | None) -> str:
    if cfg.cluster:
        return cfg.cluster
    if start and start.get("cluster"):
        return str(start["cluster"])
    return env.get("SLURM_CLUSTER_NAME") or env.get("CLUSTER") or "default"


if TYPE_CHECKING:
    Envelope = dict[str, Any]


def _job_envelope(ev: dict[str, Any]) -> Envelope:
    ts = event.iso_ms(ev["time"])
    return spool.envelope(event.TOPIC, event.key_of(ev), ev, ts)


def _dead_envelope(raw: bytes, reason: str, consumer: str) -> Envelope:
    now = time.time()
    dl = event.dead_letter(raw, reason, consumer, now)
    return spool.envelope(event.DEAD_LETTER_TOPIC, event.TOPIC, dl, int(now * 1000))


def on_prolog(cfg: HookConfig, env: Mapping[str, str], deadline: float) -> list[Envelope]:
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
    text = ""
    try:
        info, text = show.read_job(cfg.scontrol, cfg.spool_dir, env, job, deadline)
        if not info.started:
            raise ParseError(f"scontrol: job {job} is {info.state} on {info.nodes or 'no nodes'}")
    except (ParseError, OSError, ValueError) as exc:
        # no start event: one without GPUs would shadow the poller's (same event_id)
        log(cfg, f"job {job}: no start event ({exc}); the poller reports it")
        text = text or getattr(exc, "text", "")
        raw = text.encode("utf-8", "surrogateescape")  # the bytes scontrol printed
        return [_dead_envelope(raw, f"job {job}: {exc}", "slurm-hook:scontrol")]
    ev = event.job_event(info, "start", cluster_of(cfg, env, None), "hook")
    spool.save_start(cfg.spool_dir, info.raw_id, ev)
    return [_job_envelope(ev)]


def _epilog_state(env: Mapping[str, str]) -> tuple[str, str]:
    """EpilogSlurmctld gets no state: infer one from the exit code (TIMEOUT is not told apart
    from a cancellation; jobcomp/script reports it exactly)."""
    status, sig = (env.get("SLURM_JOB_EXIT_CODE2") or "0:0").partition(":")[::2]
    if sig not in ("", "0"):
        return "CANCELLED", f"0:{sig}"
    return ("FAILED" if status not in ("", "0") else "COMPLETED"), f"{status}:0"


def on_end(cfg: HookConfig, env: Mapping[str, str], epilog: bool) -> tuple[list[Envelope], str]:
    hook_env = env
    if epilog:
        state, code = _epilog_state(env)
        now = str(int(time.time()))
        env = {
            "JOBID": env.get("SLURM_JOB_ID", ""),
            "ARRAYJOBID": env.get("SLURM_ARRAY_JOB_ID", ""),
            "ARRAYTASKID": env.get("SLURM_ARRAY_TASK_ID", ""),
            "HETJOBID": env.get("SLURM_HET_JOB_ID", ""),
            "HETJOBOFFSET": env.get("SLURM_HET_JOB_OFFSET", ""),
            "USERNAME": env.get("SLURM_JOB_USER", ""),
            "ACCOUNT": env.get("SLURM_JOB_ACCOUNT", ""),
            "PARTITION": env.get("SLURM_JOB_PARTITION", ""),
            "JOBNAME": env.get("SLURM_JOB_NAME", ""),
            "NODES": env.get("SLURM_JOB_NODELIST", ""),
            "JOBSTATE": state,
            "EXITCODE": code,
            "END": now,
            "CLUSTER": env.get("SLURM_CLUSTER_NAME", ""),
        }
    info = jobcomp_env(env)
    if epilog:
        info.run = show.restart_count(hook_env) or 0  # the saved start's run wins (below)
    start = spool.load_start(cfg.spool_dir, info.raw_id)
    if start is not None and info.end and event.iso_ms(start["start_time"]) > info.end * 1000:
        # a later run's start (this run's end came late): its run, less one, is this one's
        info.run = max(0, int(start.get("run") or 0) - 1)
        start = None
    if start is not None:
        info.merge_start(start)
        if epilog:  # what the epilog does not know, the start event does
            info.start = event.iso_ms(start["start_time"]) // 1000
            info.submit = (
                event.iso_ms(start["submit_time"]) // 1000 if "submit_time" in start else None
            )
            info.qos, info.batch = start.get("qos"), not start.get("interactive", False)
    cluster = cluster_of(cfg, env, start)
    return [_job_envelope(event.job_event(info, "end", cluster, "hook"))], info.raw_id


def deliver(
    cfg: HookConfig, envelopes: Sequence[Envelope], deadline: float, send: bool = True
) -> str:
    """Send to Kafka before the deadline (with some spooled backlog), else spool (``send``
    False: spool only). Returns 'sent' or 'spooled'."""
    claimed: list[str] = []
    backlog: list[Envelope] = []
    try:
        if not send:
            raise wire.WireError("not sent")
        why = cfg.unsupported()
        if why is not None:
            raise wire.WireError(why)
        tls = cfg.tls_context()
        for path in spool.pending(cfg.spool_dir)[:BACKLOG_PER_HOOK]:
            c = spool.claim(path)
            if c is not None:
                try:
                    backlog.append(spool.read(c))
                    claimed.append(c)
                except (OSError, ValueError):
                    spool.unclaim(c)
        records = [
            (
                cfg.topic_prefix + e["topic"],
                e["key"].encode(),
                event.encode(e["value"]),
                int(e["timestamp_ms"]),
            )
            for e in [*envelopes, *backlog]
        ]
        if records:
            # stop short of the deadline: spooling (an fsync) must fit in what is left
            until = deadline - min(0.25, cfg.timeout_s / 4)
            wire.send(cfg.bootstrap, records, deadline=until, client_id=cfg.client_id, tls=tls)
    except Exception as exc:  # whatever failed in the send, the event is kept
        for c in claimed:
            spool.unclaim(c)
        for e in envelopes:
            spool.spool(cfg.spool_dir, e, e["value"].get("event_id") or f"dlq-{time.time_ns()}")
        if envelopes and send:
            log(
                cfg,
                f"Kafka at {cfg.bootstrap} did not take {len(envelopes)} event(s) ({exc}); spooled",
            )
        return "spooled"
    for c in claimed:
        spool.release(c)
    return "sent"
