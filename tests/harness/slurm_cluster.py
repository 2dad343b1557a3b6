"""A real single-node Slurm 22.05 for tests and the hook benchmark, as root, without systemd.

Debian's packages (``slurmctld slurmd slurm-client munge slurmdbd mariadb-server``) are
installed with apt-get when missing. Everything else lives under one directory: its own
munged (own socket), MariaDB + slurmdbd (so ``sacct`` works), slurmctld and slurmd on free
ports, four fake GPUs (character devices: slurmd rejects plain files), so that two test
sessions on one machine do not meet. Daemons are stopped by the PIDs they wrote.

The hooks slurmctld runs (PrologSlurmctld, EpilogSlurmctld, jobcomp/script) are a wrapper
that sources ``hooks/hook.env`` on every call (slurmctld strips the environment, and tests
point each run at their own broker, topic prefix and spool), runs the venv's
``gpugap slurm-hook``, and appends its wall and CPU time to ``hooks/timings``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge", "slurmdbd", "mariadb-server")
NEEDED = ("slurmctld", "slurmd", "sbatch", "munged", "slurmdbd", "mariadbd")
SBIN = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")
GPUGAP = Path(sys.executable).with_name("gpugap")
#: what slurmctld runs, as deploy/slurm/gpugap-hook does: ``-S`` skips site (its .pth files
#: cost more than the hook itself), the package found through PYTHONPATH instead
ROOT = Path(__file__).resolve().parents[2]
HOOK = f"PYTHONPATH={ROOT} {sys.executable} -S -m producers.slurm.hook_command"


def which(name: str) -> str | None:
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), *SBIN]))


def install() -> None:
    """apt-get install what is missing (only then: a machine that has them needs no network)."""
    if all(which(n) for n in NEEDED):
        return
    if os.geteuid() != 0 or not which("apt-get"):
        raise RuntimeError(f"Slurm is not installed and cannot install {PACKAGES} (root + apt)")
    # pytest-xdist workers each start their own cluster: one installs, the others wait for it
    with open("/tmp/gpugap-slurm-install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not all(which(n) for n in NEEDED):
            _apt_install()


def _apt_install() -> None:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], env=env, check=True, timeout=600)
    subprocess.run(
        [
            "apt-get",
            "install",
            "-y",
            "-qq",
            "-o",
            "DPkg::Lock::Timeout=600",
            "--no-install-recommends",
            *PACKAGES,
        ],
        env=env,
        check=True,
        timeout=900,
        stdout=subprocess.DEVNULL,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait(what: str, ok: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not come up within {timeout:.0f}s")


class SlurmCluster:
    def __init__(self, root: Path, cpus: int = 16) -> None:
        self.root = root
        self.cpus = cpus
        self.node = socket.gethostname().split(".")[0]
        self.name = "gg" + os.urandom(3).hex()
        self.conf = root / "etc" / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.pids: list[tuple[Path, str]] = []

    # --- start / stop -------------------------------------------------------------------
    #: the directories under root, and the fake GPUs (/dev/nvidia0...) its nodes share
    DIRS: tuple[str, ...] = (
        "etc",
        "state",
        "spool",
        "run",
        "log",
        "hooks",
        "dev",
        "jobs",
        "munge",
        "db",
    )
    GPUS = 4

    def start(self) -> None:
        install()
        self._prepare()
        self._start_accounting()
        self._daemon(
            [self.binary("slurmctld"), "-f", str(self.conf)], "run/slurmctld.pid", "slurmctld"
        )
        self._daemon([self.binary("slurmd"), "-f", str(self.conf)], "run/slurmd.pid", "slurmd")
        _wait(
            "slurm node",
            lambda: self.cmd("sinfo", "-h", "-o", "%t", check=False).stdout.strip() == "idle",
            60,
        )

    def _prepare(self) -> None:
        """Directories, munged, fake GPUs, the hook wrapper, MariaDB and the configuration."""
        r = self.root
        for d in self.DIRS:
            (r / d).mkdir(parents=True, exist_ok=True)
        self._munge()
        for i in range(self.GPUS):  # fake GPUs: character devices (plain files are rejected)
            dev = r / "dev" / f"nvidia{i}"
            if not dev.exists():
                os.mknod(dev, 0o666 | 0o020000, os.makedev(195, i))
        self._hook_wrapper()
        self.set_hook_env({})
        self._database()
        self._config()

    def _start_accounting(self) -> None:
        """slurmdbd, once it answers, with this cluster added."""
        self._daemon([self.binary("slurmdbd")], "run/slurmdbd.pid", "slurmdbd")
        _wait(
            "slurmdbd",
            lambda: self.cmd("sacctmgr", "-n", "list", "cluster", check=False).returncode == 0,
        )
        self.cmd("sacctmgr", "-i", "add", "cluster", self.name, check=False)

    def stop(self) -> None:
        for pid_file, comm in reversed(self.pids):
            with contextlib.suppress(OSError, ValueError):
                pid = int(pid_file.read_text().split()[0])
                if Path(f"/proc/{pid}/comm").read_text().strip() != comm:
                    continue
                os.kill(pid, signal.SIGTERM)
                for _ in range(100):
                    if not _alive(pid):
                        break
                    time.sleep(0.1)
                else:
                    os.kill(pid, signal.SIGKILL)
        self.pids.clear()

    def _daemon(self, argv: list[str | None], pid: str, comm: str) -> None:
        """Start a daemon that detaches itself and writes ``pid`` (named in its config)."""
        with open(self.root / "log" / f"{comm}.out", "ab") as log:
            subprocess.run(
                [str(a) for a in argv],
                env=self.env,
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                check=True,
                timeout=60,
            )
        self.pids.append((self.root / pid, comm))
        _wait(f"{comm} pid file", (self.root / pid).exists, 30)

    def _munge(self) -> None:
        """Our own munged on our own socket: another session's munged is never touched."""
        key = Path("/etc/munge/munge.key")
        if not key.exists() or key.stat().st_size == 0:
            subprocess.run([which("mungekey") or "mungekey", "--create"], check=True)
            shutil.chown(key, "munge", "munge")
            key.chmod(0o600)
        m = self.root / "munge"
        shutil.chown(m, "munge", "munge")
        m.chmod(0o755)
        self.munge_socket = m / "munge.socket"
        argv = [
            which("munged"),
            f"--socket={self.munge_socket}",
            f"--pid-file={m}/munged.pid",
            f"--log-file={m}/munged.log",
            f"--seed-file={m}/munged.seed",
            "--force",
        ]
        uid = pwd.getpwnam("munge")
        subprocess.run(
            [str(a) for a in argv],
            check=True,
            timeout=30,
            user=uid.pw_uid,
            group=uid.pw_gid,
            env={"PATH": "/usr/bin:/bin"},
        )
        self.pids.append((m / "munged.pid", "munged"))
        _wait("munged", self.munge_socket.exists, 10)

    def _database(self) -> None:
        db = self.root / "db"
        shutil.chown(db, "mysql", "mysql")
        self.db_port = free_port()
        if not (db / "data" / "mysql").exists():
            subprocess.run(
                [
                    which("mariadb-install-db") or "mariadb-install-db",
                    "--user=mysql",
                    f"--datadir={db}/data",
                    "--auth-root-authentication-method=socket",
                    "--skip-test-db",
                ],
                check=True,
                timeout=120,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        sock = db / "mysqld.sock"
        argv = [
            which("mariadbd"),
            "--user=mysql",
            f"--datadir={db}/data",
            f"--socket={sock}",
            f"--port={self.db_port}",
            "--bind-address=127.0.0.1",
            f"--pid-file={db}/mariadb.pid",
            f"--log-error={db}/mariadb.err",
            "--innodb-buffer-pool-size=64M",
        ]
        # setsid -f: mariadbd does not daemonize itself; detached, it is nobody's child here
        subprocess.run(
            [which("setsid") or "setsid", "-f", *map(str, argv)],
            check=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=30,
        )
        self.pids.append((db / "mariadb.pid", "mariadbd"))
        _wait("mariadb", sock.exists, 60)
        sql = (
            "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmpw'; "
            "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
        )
        subprocess.run(
            [which("mariadb") or "mysql", f"--socket={sock}", "-e", sql], check=True, timeout=30
        )

    def _hook_wrapper(self) -> None:
        hooks = self.root / "hooks"
        wrapper = hooks / "gpugap-hook"
        wrapper.write_text(
            "#!/bin/bash\n"
            "# slurmctld strips the environment: take it from hook.env on every call\n"
            f"set -a; . {hooks}/hook.env; set +a\n"
            f"export SLURM_CONF={self.conf}\n"
            "TIMEFORMAT='%U %S'\n"
            "t0=$EPOCHREALTIME\n"
            'if [ "$GPUGAP_TEST_HOOKS_OFF" = 1 ]; then cpu="0 0"; else\n'
            f"  cpu=$( {{ time {HOOK} >/dev/null 2>&1; }} 2>&1 ); fi\n"
            "t1=$EPOCHREALTIME\n"
            'echo "${SLURM_SCRIPT_CONTEXT:-jobcomp} ${SLURM_JOB_ID:-$JOBID} $t0 $t1 $cpu"'
            f" >> {hooks}/timings\n"
            "exit 0\n"
        )
        wrapper.chmod(0o755)
        self.wrapper = wrapper

    def set_hook_env(self, env: dict[str, str]) -> None:
        """What the next hook runs see (written atomically: hooks may be running)."""
        tmp = self.root / "hooks" / "hook.env.tmp"
        tmp.write_text("".join(f"{k}={json.dumps(str(v))}\n" for k, v in env.items()))
        tmp.replace(self.root / "hooks" / "hook.env")

    def _config(self) -> None:
        r, ctl, slurmd, dbd = self.root, free_port(), free_port(), free_port()
        auth = f"socket={self.munge_socket}"
        self.conf.write_text(f"""ClusterName={self.name}
SlurmctldHost={self.node}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo={auth}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
SlurmctldPort={ctl}
SlurmdPort={slurmd}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
SlurmdParameters=config_overrides
PrologSlurmctld={self.wrapper}
EpilogSlurmctld={self.wrapper}
JobCompType=jobcomp/script
JobCompLoc={self.wrapper}
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort={dbd}
AccountingStoragePass={self.munge_socket}
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
MinJobAge=600
KillWait=2
InactiveLimit=0
NodeName={self.node} CPUs={self.cpus} RealMemory=2000 Gres=gpu:4 State=UNKNOWN
PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""")
        (r / "etc" / "gres.conf").write_text(
            f"NodeName={self.node} Name=gpu File={r}/dev/nvidia[0-3]\n"
        )
        self._slurmdbd_conf(dbd)

    def _slurmdbd_conf(self, port: int, extra: str = "") -> None:
        """slurmdbd.conf (0600: it holds the database password) on ``port``, for MariaDB."""
        r = self.root
        dbconf = r / "etc" / "slurmdbd.conf"
        dbconf.write_text(f"""AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
{extra}DbdHost=localhost
DbdPort={port}
SlurmUser=root
LogFile={r}/log/slurmdbd.log
PidFile={r}/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={self.db_port}
StorageUser=slurm
StoragePass=slurmpw
StorageLoc=slurm_acct_db
""")
        dbconf.chmod(0o600)

    # --- using it -----------------------------------------------------------------------
    def cmd(
        self, *argv: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        tool = self.binary(argv[0]) or argv[0]
        return subprocess.run(
            [tool, *argv[1:]],
            env=self.env,
            capture_output=True,
            text=True,
            errors="replace",  # job names are bytes: Slurm prints them as given
            check=check,
            timeout=timeout,
        )

    def binary(self, name: str) -> str | None:
        """Where this cluster's Slurm program ``name`` is (Debian's here)."""
        return which(name)

    def tool(self, name: str) -> str:
        """The absolute path of a Slurm command (hooks run with no PATH)."""
        return self.binary(name) or name

    def submit(self, *args: str, wrap: str) -> str:
        out = self.cmd("sbatch", "--parsable", "-o", "/dev/null", *args, "--wrap", wrap)
        return out.stdout.strip().split(";")[0]

    def jobs(self) -> dict[str, dict[str, object]]:
        """squeue --json by raw job id (every job slurmctld remembers: 23.02 and later list
        ended ones only with ``-t all``)."""
        doc = json.loads(self.cmd("squeue", "--json", "-a", "-t", "all").stdout)
        return {str(j["job_id"]): j for j in doc["jobs"]}

    def wait(self, pred: object, what: str, timeout: float = 150) -> dict[str, dict[str, object]]:
        deadline = time.monotonic() + timeout
        while True:
            jobs = self.jobs()
            if pred(jobs):  # type: ignore[operator]
                return jobs
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(0.3)

    def timings(self, cpu: bool = False) -> list[tuple[str, str, float]]:
        """(context, job id, seconds) of every hook run so far: wall time as slurmctld waits
        for it, or with ``cpu`` the hook process's own CPU time (user + system)."""
        path = self.root / "hooks" / "timings"
        out = []
        for line in path.read_text().splitlines() if path.exists() else []:
            ctx, job, t0, t1, user, system = line.split()
            out.append((ctx, job, float(user) + float(system) if cpu else float(t1) - float(t0)))
        return out
