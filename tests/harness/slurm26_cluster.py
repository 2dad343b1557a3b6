"""A real Slurm 26.05 for tests: slurmctld + slurmdbd (MariaDB) + two slurmd on one host, with
slurmctld publishing job starts and ends to Kafka itself (jobcomp/kafka) and serving its own
OpenMetrics, as ../shared/reference/slurm-26.md describes it.

Built once from the vendored source (harness/slurm26_build.py). Everything else is the 22.05
harness's (harness/slurm_cluster.py): its own munged, MariaDB, free ports, fake GPUs (character
devices), daemons stopped by the PIDs they wrote. Differences, each from the reference:

- ``AccountingStorageTRES=gres/gpu`` with slurmdbd: without it the records carry no GPU at all;
- two slurmd (this host and ``n2``, 4 GPUs each): a heterogeneous job needs a node per part;
  ``n2`` runs from a copy of slurm.conf that differs only in its slurmd files;
- ``requeue_delay=3``: a requeued job waits 3 s, not ``cred_expire`` (120 s), to run again;
- auth/jwt beside munge, and ``start_slurmrestd()`` (as user slurm, which it insists on) with
  ``token()`` for a reader;
- the hook still runs as PrologSlurmctld/EpilogSlurmctld (a cluster has one JobCompType, here
  jobcomp/kafka), so the two paths see the same jobs and tests can compare them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from tests.harness.slurm26_build import build
from tests.harness.slurm_cluster import SlurmCluster, _wait, free_port

#: the topics slurmctld writes (JobCompParams topic= and topic_job_start=)
END_TOPIC = "slurm-jobcomp"
START_TOPIC = "slurm-jobstart"
SECOND_NODE = "n2"
ACCOUNT = "ml-team"


class Slurm26Cluster(SlurmCluster):
    def __init__(self, root: Path, bootstrap: str, topic_prefix: str = "") -> None:
        super().__init__(root)
        self.prefix = build()
        self.bootstrap = bootstrap
        self.end_topic = topic_prefix + END_TOPIC
        self.start_topic = topic_prefix + START_TOPIC
        self.nodes = (self.node, SECOND_NODE)

    def binary(self, name: str) -> str | None:
        for sub in ("sbin", "bin"):
            path = self.prefix / sub / name
            if path.exists():
                return str(path)
        return None

    # --- start / stop -------------------------------------------------------------------
    DIRS = (*SlurmCluster.DIRS, "etc2", "spool2")
    GPUS = 8  # nvidia0-3 on this host, nvidia4-7 on n2

    def start(self) -> None:
        self._prepare()
        self._start_accounting()
        self.cmd("sacctmgr", "-i", "add", "account", ACCOUNT, f"Cluster={self.name}")
        self.cmd("sacctmgr", "-i", "add", "user", "root", f"Account={ACCOUNT}")
        self.start_controller()
        self._daemon([self.binary("slurmd"), "-f", str(self.conf)], "run/slurmd.pid", "slurmd")
        self._daemon(
            [self.binary("slurmd"), "-N", SECOND_NODE, "-f", str(self.conf2)],
            "run/slurmd2.pid",
            "slurmd",
        )
        _wait("slurm nodes", self._all_idle, 60)

    def _all_idle(self) -> bool:
        out = self.cmd("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout.split("\n")
        states = dict(line.split() for line in out if line.strip())
        return all(states.get(n) == "idle" for n in self.nodes)

    def start_controller(self) -> None:
        self._daemon(
            [self.binary("slurmctld"), "-f", str(self.conf)], "run/slurmctld.pid", "slurmctld"
        )
        _wait("slurmctld", lambda: self.cmd("scontrol", "ping", check=False).returncode == 0, 30)

    def stop_controller(self) -> None:
        """SIGTERM slurmctld and wait for it to exit (it saves jobcomp/kafka's queue first)."""
        pid_file = self.root / "run" / "slurmctld.pid"
        pid = int(pid_file.read_text().split()[0])
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.pids = [p for p in self.pids if p[0] != pid_file]

    def start_slurmrestd(self) -> str:
        """slurmrestd with auth/jwt on a free port, as user slurm (it refuses root and
        SlurmUser); stopped with the rest. Returns its URL."""
        port = free_port()
        pid_file, log = self.root / "run" / "slurmrestd.pid", self.root / "log" / "slurmrestd.log"
        # user slurm cannot read the build under root's home: its program and libraries are
        # copied beside the cluster, found through LD_LIBRARY_PATH and its own PluginDir
        home = self.root / "restd"
        (home / "lib").mkdir(parents=True, exist_ok=True)
        shutil.copy2(self.prefix / "sbin" / "slurmrestd", home / "slurmrestd")
        for library in (self.prefix / "lib" / "slurm").glob("*.so"):
            shutil.copy2(library, home / "lib" / library.name)
        conf = home / "slurm.conf"
        conf.write_text(self.conf.read_text() + f"PluginDir={home / 'lib'}\n")
        inner = (
            f"echo $$ > {pid_file}; exec setpriv --reuid=slurm --regid=slurm --clear-groups "
            f"env SLURM_JWT=daemon SLURM_CONF={conf} LD_LIBRARY_PATH={home / 'lib'} "
            f"{home / 'slurmrestd'} -a rest_auth/jwt 127.0.0.1:{port} >> {log} 2>&1"
        )
        subprocess.run(["setsid", "-f", "sh", "-c", inner], check=True, timeout=30)
        self.pids.append((pid_file, "slurmrestd"))
        url = f"http://127.0.0.1:{port}"

        def answers() -> bool:
            try:
                urllib.request.urlopen(f"{url}/openapi/v3", timeout=2).close()
            except OSError as exc:
                return getattr(exc, "code", None) is not None  # any HTTP answer: it is up
            return True

        _wait("slurmrestd", answers, 30)
        return url

    def token(self, user: str = "slurm", lifespan_s: int = 7200) -> str:
        """A JWT for ``user`` (``scontrol token``), as a site hands one to a reader."""
        out = self.cmd("scontrol", "token", f"username={user}", f"lifespan={lifespan_s}")
        return out.stdout.strip().split("=", 1)[1]

    def metrics(self, path: str = "jobs-users-accts") -> str:
        """slurmctld's own OpenMetrics page (``/metrics/<path>``)."""
        with urllib.request.urlopen(f"{self.metrics_url}/{path}", timeout=10) as answer:
            return str(answer.read().decode())

    # --- configuration ------------------------------------------------------------------
    def _config(self) -> None:
        r, ctl, dbd = self.root, free_port(), free_port()
        slurmd, slurmd2 = free_port(), free_port()
        auth = f"socket={self.munge_socket}"
        self.metrics_url = f"http://127.0.0.1:{ctl}/metrics"
        self.jwt_key = r / "etc" / "jwt_hs256.key"
        if not self.jwt_key.exists():
            self.jwt_key.write_bytes(os.urandom(32))
            self.jwt_key.chmod(0o600)
        jwt = f"AuthAltTypes=auth/jwt\nAuthAltParameters=jwt_key={self.jwt_key}\n"
        rdkafka = r / "etc" / "rdkafka.conf"
        # message.timeout.ms: a broker outage times messages out in 10 s; with
        # requeue_on_msg_timeout slurmctld produces them again until the broker takes them
        rdkafka.write_text(f"bootstrap.servers={self.bootstrap}\nmessage.timeout.ms=10000\n")
        common = f"""ClusterName={self.name}
SlurmctldHost={self.node}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo={auth}
{jwt}StateSaveLocation={r}/state
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmctldDebug=verbose
DebugFlags=JobComp
SlurmctldPort={ctl}
SlurmdPort={slurmd}
ProctrackType=proctrack/linuxproc
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1,requeue_delay=3
SlurmdParameters=config_overrides
PrologSlurmctld={self.wrapper}
EpilogSlurmctld={self.wrapper}
JobCompType=jobcomp/kafka
JobCompLoc={rdkafka}
JobCompParams=topic={self.end_topic},enable_job_start,topic_job_start={self.start_topic},\
poll_interval=1,flush_timeout=500,requeue_on_msg_timeout
MetricsType=metrics/openmetrics
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
NodeName={self.node} CPUs=16 RealMemory=4000 Gres=gpu:4 State=UNKNOWN
NodeName={SECOND_NODE} NodeHostname={SECOND_NODE} NodeAddr=127.0.0.1 Port={slurmd2} CPUs=16 \
RealMemory=4000 Gres=gpu:4 State=UNKNOWN
PartitionName=gpu Nodes={self.node},{SECOND_NODE} Default=YES MaxTime=INFINITE DefaultTime=10 \
State=UP
"""
        self.conf.write_text(
            common + f"SlurmdSpoolDir={r}/spool\nSlurmdPidFile={r}/run/slurmd.pid\n"
            f"SlurmdLogFile={r}/log/slurmd.log\n"
        )
        self.conf2 = r / "etc2" / "slurm.conf"
        self.conf2.write_text(
            common + f"SlurmdSpoolDir={r}/spool2\nSlurmdPidFile={r}/run/slurmd2.pid\n"
            f"SlurmdLogFile={r}/log/slurmd2.log\n"
        )
        gres = (
            f"NodeName={self.node} Name=gpu File={r}/dev/nvidia[0-3]\n"
            f"NodeName={SECOND_NODE} Name=gpu File={r}/dev/nvidia[4-7]\n"
        )
        for etc in ("etc", "etc2"):
            (r / etc / "gres.conf").write_text(gres)
        self._slurmdbd_conf(dbd, extra=jwt)
