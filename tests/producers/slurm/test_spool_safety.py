"""The Slurm hook runs as root (or SlurmUser) on a spool another user may have touched: it never
writes, appends or chmods through a symbolic link, and refuses a spool directory that is a
link, another user's or writable by group/others, with one line on stderr and exit 0 (a
prolog that fails drains the node). The drainer reads the same spool under the same rules.
No Kafka here: the broker is unreachable (127.0.0.1:1), so the hook spools."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpugap.groundfloor.kafka.consume import DeadLetters
from gpugap.groundfloor.kafka.publish import JsonlPublisher
from gpugap.producers.slurm import spool
from gpugap.producers.slurm.drain import drain_once
from gpugap.producers.slurm.drain import main as drain_main
from gpugap.producers.slurm.hook_command import run
from tests.producers.slurm.test_parse import FIX, env_file

REPO = Path(__file__).resolve().parents[3]
OTHER_UID = 54321  # not this process's user (tests run as root here)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chowns to another uid")


def mode(p: Path) -> int:
    return os.lstat(p).st_mode & 0o7777


def hook_env(root: Path, tmp_path: Path, **extra: str) -> dict[str, str]:
    scontrol = tmp_path / "scontrol"
    if not scontrol.exists():  # what Slurm 22.05 printed for job 11 (a name like fields)
        scontrol.write_text(f"#!/bin/sh\ncat {FIX / 'scontrol_prolog_hostile_name.txt'}\n")
        scontrol.chmod(0o755)
    return {
        "GPUGAP_KAFKA_BOOTSTRAP": "127.0.0.1:1",  # down: every event is spooled
        "GPUGAP_SLURM_SPOOL_DIR": str(root),
        "GPUGAP_SLURM_CLUSTER": "probe",
        "GPUGAP_SLURM_SCONTROL": str(scontrol),
        "GPUGAP_SLURM_HOOK_TIMEOUT_S": "2",
        **extra,
    }


def jobcomp(root: Path, tmp_path: Path) -> dict[str, str]:
    return {**env_file("env_jobcomp_failed.env"), **hook_env(root, tmp_path)}


def prolog(root: Path, tmp_path: Path) -> dict[str, str]:
    return {**env_file("env_prolog_hostile_name.env"), **hook_env(root, tmp_path)}


def hook_process(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The hook as slurmctld runs it: its own process; it must exit 0 whatever happens."""
    out = subprocess.run(
        [sys.executable, "-S", "-m", "gpugap.producers.slurm.hook_command"],
        env={**env, "PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    return out


def private_root(tmp_path: Path) -> Path:
    root = tmp_path / "spool"
    root.mkdir(mode=0o700)
    return root


def outside(tmp_path: Path) -> tuple[Path, bytes, int]:
    """A file of someone else's the hook must never change: (path, content, mode)."""
    target = tmp_path / "elsewhere" / "precious.txt"
    target.parent.mkdir()
    target.write_bytes(b"not the hook's\n")
    target.chmod(0o644)
    return target, target.read_bytes(), mode(target)


# --- the normal case --------------------------------------------------------------------------


def test_a_private_spool_still_works(tmp_path: Path) -> None:
    root = tmp_path / "spool"  # made by the hook
    assert run(prolog(root, tmp_path)) == "spooled"
    assert run(jobcomp(root, tmp_path)) == "spooled"
    assert [p.name for p in (root / "jobs").iterdir()] == ["11.json"]
    assert len(spool.pending(str(root))) == 2
    assert "did not take" in (root / "hook.log").read_text()
    for d in (root, root / "events", root / "jobs"):
        assert mode(d) == 0o700, d
    files = [p for p in root.rglob("*") if p.is_file()]
    assert all(mode(p) == 0o600 for p in files), [(p, oct(mode(p))) for p in files]
    assert not [p for p in root.rglob("*") if p.name.endswith(".tmp")]
    # an existing private directory of the administrator's (0750, readable by a group)
    root.chmod(0o750)
    assert run(jobcomp(root, tmp_path)) == "spooled" and mode(root) == 0o750


# --- hook.log, a temporary name, a start record: links are not followed -----------------------


def test_hook_log_that_is_a_symlink_is_never_written_through(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    root = private_root(tmp_path)
    target, content, before = outside(tmp_path)
    (root / "hook.log").symlink_to(target)
    assert run(jobcomp(root, tmp_path)) == "spooled"  # the event is kept all the same
    assert target.read_bytes() == content and mode(target) == before  # not appended, not chmodded
    assert (root / "hook.log").is_symlink() and len(spool.pending(str(root))) == 1
    err = capfd.readouterr().err
    assert "did not take" in err and f"{root / 'hook.log'}: it is a symbolic link" in err


def test_hook_log_that_is_a_hard_link_or_a_fifo_is_not_written(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    root = private_root(tmp_path)
    target, content, before = outside(tmp_path)
    os.link(target, root / "hook.log")  # the same file as one elsewhere
    assert run(jobcomp(root, tmp_path)) == "spooled"
    assert target.read_bytes() == content and mode(target) == before
    assert "hook.log: not a regular file with one link" in capfd.readouterr().err
    (root / "hook.log").unlink()
    os.mkfifo(root / "hook.log")  # opened for writing without a reader: would block the hook
    out = hook_process(jobcomp(root, tmp_path))  # returns (the timeout would fail it)
    assert "hook.log: it is not a regular file (a FIFO" in out.stderr, out.stderr
    assert len(spool.pending(str(root))) == 1


def test_temporary_and_start_files_are_never_written_through_links(tmp_path: Path) -> None:
    """The temporary names the next writes use, and the start record the end hook reads."""
    root = private_root(tmp_path)
    (root / "jobs").mkdir(mode=0o700)
    target, content, before = outside(tmp_path)
    pid = os.getpid()  # run() is this process
    (root / "jobs" / f".11.json.{pid}.tmp").symlink_to(target)  # the start record's
    (root / f".scontrol-json.{pid}.tmp").symlink_to(target)  # what scontrol can do
    assert run(prolog(root, tmp_path)) == "spooled"
    assert target.read_bytes() == content and mode(target) == before
    start = root / "jobs" / "11.json"
    assert start.is_file() and not start.is_symlink() and mode(start) == 0o600
    assert not start.with_name(f".11.json.{pid}.tmp").exists()
    # a start record that is a link to a file elsewhere is not read: the end is still sent
    start.unlink()
    fake = tmp_path / "elsewhere" / "11.json"
    fake.write_text(json.dumps({"time_limit_s": 424242, "gpus_total": 99, "nodes": []}))
    start.symlink_to(fake)
    assert run({**jobcomp(root, tmp_path), "JOBID": "11"}) == "spooled"
    spooled = [spool.read(p)["value"] for p in spool.pending(str(root))]
    (end,) = [e for e in spooled if e["event_id"] == "slurm/probe/11/end"]
    assert "424242" not in json.dumps(end) and end.get("gpus_total") != 99
    assert fake.exists()


# --- a spool directory (or events/, jobs/) others control: refused, one line, exit 0 ----------


@pytest.mark.parametrize("sub", ["events", "jobs"])
def test_a_subdirectory_that_is_a_symlink_is_refused(tmp_path: Path, sub: str) -> None:
    root = private_root(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    (root / sub).symlink_to(elsewhere)
    for env in (prolog(root, tmp_path), jobcomp(root, tmp_path)):
        out = hook_process(env)
        (line,) = out.stderr.splitlines()
        assert f"refusing spool directory {root / sub}: it is a symbolic link" in line, line
        assert f"(to {elsewhere})" in line and f"rm {root / sub}" in line
    assert list(elsewhere.iterdir()) == [] and mode(elsewhere) == 0o755  # nothing written there
    assert not (root / "hook.log").exists()
    assert run(jobcomp(root, tmp_path)) == "refused"


def test_a_spool_root_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    root = tmp_path / "spool"
    root.symlink_to(elsewhere)
    out = hook_process(jobcomp(root, tmp_path))
    (line,) = out.stderr.splitlines()
    assert f"refusing spool directory {root}: it is a symbolic link" in line
    env = jobcomp(root, tmp_path)
    env["GPUGAP_SLURM_SPOOL_DIR"] += "/"  # 'spool/': lstat would follow the link
    assert run(env) == "refused"
    assert list(elsewhere.iterdir()) == [] and mode(elsewhere) == 0o755


WRITABLE = "writable by its group or others"


@needs_root
@pytest.mark.parametrize(
    ("where", "perm", "uid", "why"),
    [
        pytest.param("", 0o770, 0, WRITABLE, id="root-0770"),
        pytest.param("", 0o707, 0, WRITABLE, id="root-0707"),
        pytest.param("", 0o1777, 0, WRITABLE, id="root-1777"),  # sticky: others still add
        pytest.param("", 0o700, OTHER_UID, f"owned by uid {OTHER_UID}", id="root-other-uid"),
        pytest.param("events", 0o775, 0, WRITABLE, id="events-0775"),
        pytest.param("jobs", 0o700, OTHER_UID, f"owned by uid {OTHER_UID}", id="jobs-other-uid"),
    ],
)
def test_a_spool_others_can_write_is_refused_in_one_line(
    tmp_path: Path, where: str, perm: int, uid: int, why: str
) -> None:
    root = private_root(tmp_path)
    d = root / where if where else root
    d.mkdir(exist_ok=True)
    os.chown(d, uid, -1)
    d.chmod(perm)
    (root / "events").mkdir(mode=0o700, exist_ok=True)
    for env in (prolog(root, tmp_path), jobcomp(root, tmp_path)):
        out = hook_process(env)
        (line,) = out.stderr.splitlines()  # one clear line
        assert f"refusing spool directory {d} (owner uid {uid}, mode {perm:04o})" in line, line
        assert why in line and f"chown root:root {d} && chmod 0700 {d}" in line, line
        assert "the poller still reports the job" in line
    assert mode(d) == perm and os.lstat(d).st_uid == uid  # left as it was: never chmodded
    assert not (root / "hook.log").exists() and not spool.pending(str(root))
    assert not (root / "jobs").exists() or not list((root / "jobs").iterdir())
    # once it is private again, the hook works
    os.chown(d, 0, -1)
    d.chmod(0o700)
    assert run(jobcomp(root, tmp_path)) == "spooled"


# --- the drainer (and the poller, which calls drain_once) -------------------------------------


def drain(root: Path, tmp_path: Path) -> list[dict[str, object]]:
    out = tmp_path / "shipped.jsonl"

    async def go() -> int:
        pub = JsonlPublisher(out)
        await pub.start()
        try:
            return await drain_once(root, pub, DeadLetters(pub, "test"))
        finally:
            await pub.close()

    asyncio.run(go())
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def test_drainer_ships_no_spooled_file_that_is_a_link(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    assert run(jobcomp(root, tmp_path)) == "spooled"
    (real,) = spool.pending(str(root))
    forged = tmp_path / "elsewhere" / "forged.json"
    forged.parent.mkdir()
    forged.write_bytes(Path(real).read_bytes().replace(b'"probe"', b'"forged"'))
    (root / "events" / "0000000000001-forged.json").symlink_to(forged)
    assert [os.path.basename(p) for p in spool.pending(str(root))] == [os.path.basename(real)]
    shipped = drain(root, tmp_path)
    assert [r["value"]["cluster"] for r in shipped] == ["probe"]  # type: ignore[index]
    assert forged.exists() and (root / "events" / "0000000000001-forged.json").is_symlink()


@needs_root
@pytest.mark.parametrize("case", ["events-link", "group-writable", "other-owner"])
def test_drainer_refuses_a_spool_others_control(tmp_path: Path, case: str) -> None:
    root = tmp_path / "spool"
    assert run(jobcomp(root, tmp_path)) == "spooled"
    elsewhere = tmp_path / "elsewhere"
    if case == "events-link":
        (root / "events").rename(elsewhere)
        (root / "events").symlink_to(elsewhere)
    elif case == "group-writable":
        root.chmod(0o770)
    else:
        os.chown(root, OTHER_UID, -1)
    with pytest.raises(spool.UnsafeSpool, match="refusing spool directory"):
        drain(root, tmp_path)
    assert issubclass(spool.UnsafeSpool, OSError)  # what the poller logs, then goes on
    assert (tmp_path / "shipped.jsonl").read_text() == ""  # nothing shipped
    if case == "events-link":
        assert len(list(elsewhere.iterdir())) == 1  # not claimed, not deleted
    # the command says so and exits 2 before asking Kafka (no broker here)
    assert drain_main(["--spool-dir", str(root)]) == 2


@needs_root
def test_drainer_refuses_a_spool_of_another_user_and_says_whose(tmp_path: Path) -> None:
    """As root over a spool another account owns (0700): that account could swap events/ for
    a link between the check and the reads, so it is refused, saying to run it as the owner
    (the poller and the drain unit run as SlurmUser, the hook's user)."""
    root = tmp_path / "spool"
    assert run(jobcomp(root, tmp_path)) == "spooled"
    for p in [root, *root.rglob("*")]:
        os.chown(p, OTHER_UID, -1, follow_symlinks=False)
    with pytest.raises(spool.UnsafeSpool) as info:
        drain(root, tmp_path)
    msg = str(info.value)
    assert f"owned by uid {OTHER_UID}" in msg and f"run this as its owner, {OTHER_UID}" in msg
    assert "\n" not in msg and len(spool.pending(str(root))) == 1
