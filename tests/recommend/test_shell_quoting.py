"""The commands `gpugap recommend` prints for a person to paste: every value from a record is
one word in dash (Debian's /bin/sh) and in bash, whatever its user typed. Each printed command
is run, as printed, in both shells, with stand-ins for sbatch/scontrol/squeue/sacctmgr/kubectl
that write down the arguments they were given."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpugap.recommend.base import HistoryWindow, k8s_target, said, sh
from gpugap.recommend.batch import GpuFamily, SlurmFamily, gpu_count, time_limit
from gpugap.recommend.fit import GpuUse, gpu_share
from gpugap.recommend.placement import PartialGang, placement
from gpugap.recommend.services import ServiceDemand, ServiceHour, service_schedule
from gpugap.schemas.models import Recommendation
from gpugap.schemas.types import WorkloadClass

SHELLS = [s for s in ("dash", "bash") if shutil.which(s)]
if len(SHELLS) < 2:  # pragma: no cover - the image has both (apt-get install -y dash)
    pytest.fail(f"needs dash and bash (apt-get install -y dash), found {SHELLS}", pytrace=False)

HOSTILE = {
    "tab": "train\t';touch PWN;#",  # the issue's: $'...' in dash runs `touch PWN`
    "newline": "a\nb'; touch PWN; '",
    "soh": "x\x01y';touch PWN;'",
    "esc": "esc\x1b[31m';touch PWN #",
    "quotes": 'it\'s "quoted" \'\' ""',
    "subst": "$(touch PWN)",
    "backticks": "`touch PWN`",
    "semicolon": "a;touch PWN;b",
    "unicode": "ünï℃ødé 名前 \u202eNWP hcuot",  # a bidi override (not printable) too
    "surrogate": "caf\udce9';touch PWN;'",  # undecodable bytes (os.environ's surrogates)
    "long": "n" * 300 + "';touch PWN;'$(touch PWN)`touch PWN`" + "\t" * 50,
}
#: a record cannot hold a surrogate (pydantic refuses it): sh() alone gets that one
IN_RECORDS = sorted(set(HOSTILE) - {"surrogate"})
PROGRAMS = ("sbatch", "scontrol", "squeue", "sacctmgr", "kubectl")
#: commands printed inside a comment line, after these words (a person copies from there)
IN_COMMENTS = ("# or cap it for the QOS: ", "# without KEDA: ")
NOW = datetime(2026, 11, 9, tzinfo=UTC)
WEEK = HistoryWindow(NOW - timedelta(days=7), NOW, 7.0)

STUB = """#!{python} -S
import json, os, sys
name = os.path.basename(sys.argv[0])
stdin = sys.stdin.read() if sys.argv[1:4] == ["apply", "-f", "-"] else None
with open(os.environ["ARGV_LOG"], "a", encoding="utf-8", errors="surrogateescape") as fh:
    fh.write(json.dumps({{"argv": [name, *sys.argv[1:]], "stdin": stdin}}) + "\\n")
if name == "squeue":
    print(42)  # one pending job, for the xargs ... scontrol update after the pipe
"""


@pytest.fixture
def stubs(tmp_path: Path) -> Path:
    """A PATH directory of stand-ins that log their arguments as JSON."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in PROGRAMS:
        p = bin_dir / name
        p.write_text(STUB.format(python=sys.executable))
        p.chmod(0o755)
    return bin_dir


def run_in(shell: str, script: str, stubs: Path, where: Path) -> list[dict[str, Any]]:
    """Run ``script`` as a person pasting it would: in ``shell``, in an empty directory; no
    PWN file may appear. Returns the stand-ins' calls."""
    where.mkdir(parents=True)
    log = where.parent / f"{where.name}.argv"
    pasted = where.parent / f"{where.name}.sh"
    pasted.write_text(script, errors="surrogateescape")
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "ARGV_LOG": str(log), "LC_ALL": "C.UTF-8"}
    out = subprocess.run(
        [shell, str(pasted)], cwd=where, env=env, capture_output=True, timeout=60, check=False
    )
    assert not list(where.parent.rglob("PWN*")), (shell, script, out.stderr)
    assert out.returncode == 0, (shell, script, out.stderr)
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text(errors="surrogateescape").splitlines()]


def scripts(rec: Recommendation) -> list[str]:
    """What a person pastes: the whole block, and each command shown inside a comment."""
    out = [rec.apply]
    for line in rec.apply.splitlines():
        for lead in IN_COMMENTS:
            if line.startswith(lead):
                out.append(line[len(lead) :])
    return out


def calls(shell: str, rec: Recommendation, stubs: Path, tmp: Path) -> list[dict[str, Any]]:
    """The stand-ins' calls, from every script a person could paste of ``rec``."""
    found: list[dict[str, Any]] = []
    for i, script in enumerate(scripts(rec)):
        found += run_in(shell, script, stubs, tmp / f"{shell}-{i}")
    return found


def argvs(shell: str, rec: Recommendation, stubs: Path, tmp: Path) -> list[list[str]]:
    return [c["argv"] for c in calls(shell, rec, stubs, tmp)]


# --- sh() itself --------------------------------------------------------------------------


def test_sh_is_posix_quoting_of_the_printable_value() -> None:
    for value in HOSTILE.values():
        word = sh(value)
        assert "$'" not in word and word.isprintable() and "\n" not in word
        assert said(value) == "".join(c if c.isprintable() else "?" for c in value)
    assert sh("train\t") == "'train?'" and sh("plain-name_1.0") == "plain-name_1.0"
    assert sh("") == "''" and sh("it's") == "'it'\"'\"'s'"


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_value_is_one_argument_in_the_shell(
    shell: str, case: str, stubs: Path, tmp_path: Path
) -> None:
    value = HOSTILE[case]
    script = f"sbatch --job-name={sh(value)} train.sbatch\nscontrol show job {sh(value)}"
    got = [c["argv"] for c in run_in(shell, script, stubs, tmp_path / "run")]
    assert got == [
        ["sbatch", f"--job-name={said(value)}", "train.sbatch"],
        ["scontrol", "show", "job", said(value)],
    ]


@pytest.mark.parametrize("shell", SHELLS)
def test_a_very_long_value_is_still_one_argument(shell: str, stubs: Path, tmp_path: Path) -> None:
    value = ("x';touch PWN;'\t" * 7000)[:100_000]  # under Linux's 128 KiB per argument
    got = run_in(shell, f"scontrol {sh(value)}", stubs, tmp_path / "run")
    assert [c["argv"] for c in got] == [["scontrol", said(value)]]


# --- the recommenders' printed commands ----------------------------------------------------


def slurm_time_limit(v: str) -> Recommendation:
    fam = SlurmFamily(
        cluster="hpc", user=v, account=v, job_name=v, partition=v, qos=v,
        elapsed_s=(3600.0,) * 5, limit_s=(8 * 3600,) * 5, gpus=(1,) * 5, timeouts=0, jobs=5,
    )  # fmt: skip
    rec = time_limit(fam, WEEK, NOW)
    assert rec is not None
    return rec


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("case", IN_RECORDS)
def test_slurm_time_limit_commands_run_as_printed(
    shell: str, case: str, stubs: Path, tmp_path: Path
) -> None:
    v = HOSTILE[case]
    got = argvs(shell, slurm_time_limit(v), stubs, tmp_path)
    s = said(v)
    assert got == [
        ["squeue", "-h", "-t", "PD", "-u", s, f"--name={s}", f"--partition={s}", "-o", "%i"],
        ["scontrol", "update", "JobId=42", "TimeLimit=1:15:00"],
        ["sacctmgr", "modify", "qos", s, "set", "MaxWall=1:15:00"],
    ]


def patch_of(argv: list[str]) -> list[str]:
    assert argv[6:8] == ["--type=json", "-p"] and len(argv) == 9, argv
    json.loads(argv[8])  # the JSON patch arrives whole
    return argv[:6]


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("case", IN_RECORDS)
def test_kubernetes_commands_run_as_printed(
    shell: str, case: str, stubs: Path, tmp_path: Path
) -> None:
    v = HOSTILE[case]
    s = said(v)
    target = k8s_target("k8s", v, v, v, "pod-0")  # namespace, owner kind and name
    fam = GpuFamily(
        target=target, workload_class=WorkloadClass.BATCH, gpus=4, allocations=5, max_busy=1,
        mean_busy=1.0, sd_busy=0.0, hours=100.0, gpu_hours=400.0, consumed_gpu_hours=50.0,
    )  # fmt: skip
    use = GpuUse(
        target=target, workload_class=WorkloadClass.SERVICE, gpus=1, allocations=1,
        gpu_hours=168.0, measured_minutes=7 * 1440, memory_minutes=7 * 1440,
        allocation_peaks=(0.08,), peak_memory_mib=6000.0, gpu_model=None,
    )  # fmt: skip
    hours = tuple(
        ServiceHour(WEEK.since + timedelta(hours=h), 4.0, 2.5 if 8 <= h % 24 < 16 else 0.5)
        for h in range(7 * 24)
    )
    demand = ServiceDemand(target, WorkloadClass.SERVICE, 1, 7, hours)
    gangs = [PartialGang(target, f"g{i}", f"a{i}", 10.0, 4, 2, 2) for i in range(3)]
    recs = {
        "gpu_count": gpu_count(fam, WEEK, NOW),
        "gpu_share": gpu_share(use, WEEK, NOW),
        "service_schedule": service_schedule(demand, WEEK, NOW),
        "placement": placement(target, gangs, WEEK, NOW),
    }
    assert all(r is not None for r in recs.values()), recs
    kind = said(v.lower())
    r = recs["gpu_count"]
    assert r is not None
    (patch,) = argvs(shell, r, stubs, tmp_path / "count")
    assert patch_of(patch) == ["kubectl", "-n", s, "patch", kind, s]
    r = recs["gpu_share"]
    assert r is not None
    (patch,) = argvs(shell, r, stubs, tmp_path / "share")
    assert patch_of(patch) == ["kubectl", "-n", s, "patch", kind, s]
    r = recs["service_schedule"]
    assert r is not None
    applied, scale = calls(shell, r, stubs, tmp_path / "svc")
    assert applied["argv"] == ["kubectl", "apply", "-f", "-"]
    yaml = applied["stdin"]
    assert "kind: ScaledObject" in yaml and json.dumps(v) in yaml  # read by no shell
    assert scale["argv"] == ["kubectl", "-n", s, "scale", kind, s, "--replicas=N", "from", "cron"]
    r = recs["placement"]
    assert r is not None
    (sbatch,) = argvs(shell, r, stubs, tmp_path / "place")
    assert sbatch == [
        "sbatch", "--nodes=4", "--ntasks-per-node=1", "--gpus-per-node=2", f"--job-name={s}",
        "train.sbatch",
    ]  # fmt: skip
