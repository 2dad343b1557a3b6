"""Three Apache Kafka nodes in KRaft combined mode (broker + controller each) on loopback, for
the fault tests (tests/streams/test_kafka_faults.py): replication factor 3 everywhere,
``min.insync.replicas=2``, no unclean leader election, and nodes that can be stopped
(SIGTERM), killed (SIGKILL) and started again on the same data directory and ports.

The jars, the Java check, the storage format and the detached start are the project's own
(:mod:`gpugap.services.kafka`); only the properties differ: ``controller.quorum.voters``
names the three nodes, and each has a small heap so three JVMs fit a CI machine.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpugap.groundfloor.settings import ServicesSettings
from gpugap.schemas.errors import ServiceError
from gpugap.services.kafka import (
    LOG4J2,
    _answers,
    _tail,
    broker_ready,
    fetch,
    free_port,
    java_major,
    process_alive,
)

HOST = "127.0.0.1"

SERVER = """process.roles=broker,controller
node.id={node_id}
controller.quorum.voters={voters}
listeners=PLAINTEXT://{host}:{port},CONTROLLER://{host}:{cport}
advertised.listeners=PLAINTEXT://{host}:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs={data}
num.partitions=1
default.replication.factor={rf}
min.insync.replicas={isr}
unclean.leader.election.enable=false
offsets.topic.replication.factor={rf}
offsets.topic.num.partitions=4
transaction.state.log.replication.factor={rf}
transaction.state.log.min.isr={isr}
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor={rf}
share.coordinator.state.topic.min.isr={isr}
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
delete.topic.enable=true
# records carry their event time (weeks ago in the simulator): keep everything
log.retention.ms=-1
log.retention.bytes=-1
# the test moves leaders itself; a preferred-leader election mid-fault would blur its timings
auto.leader.rebalance.enable=false
"""


@dataclass
class Node:
    node_id: int
    port: int
    cport: int
    home: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def props(self) -> Path:
        return self.home / "server.properties"

    @property
    def log_file(self) -> Path:
        return self.home / "server.log"

    def alive(self) -> bool:
        return self.proc is not None and process_alive(self.proc.pid)


class KafkaCluster:
    """``size`` KRaft nodes (ids 1..size), each broker and controller, under ``root``."""

    def __init__(
        self,
        root: Path,
        size: int = 3,
        heap: str = "384m",
        settings: ServicesSettings | None = None,
        start_timeout_s: float = 120.0,
    ) -> None:
        self.root = root
        self.heap = heap
        self.settings = settings or ServicesSettings()
        self.start_timeout_s = start_timeout_s
        self.nodes = {
            i: Node(i, free_port(), free_port(), root / f"node{i}") for i in range(1, size + 1)
        }
        self.cluster_id = ""
        self._libs: Path | None = None

    # --- addresses ---------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        return ",".join(n.address for n in self.nodes.values())

    def bootstrap_without(self, node_id: int) -> str:
        return ",".join(n.address for i, n in self.nodes.items() if i != node_id)

    def _java(self, heap: str | None = None, log4j: Path | None = None) -> list[str]:
        assert self._libs is not None, "start() the cluster first"
        heap = heap or self.heap
        return [
            shutil.which("java") or "java",
            f"-Xmx{heap}",
            "-Xms64m",
            "-XX:+UseG1GC",
            "-XX:TieredStopAtLevel=1",  # C1 only: starts faster, costs little on a test's load
            "-Djava.awt.headless=true",
            *([f"-Dlog4j2.configurationFile={log4j}"] if log4j else []),
            "-cp",
            f"{self._libs}/*",
        ]

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Format every node's storage with one cluster id, start them all, and return once
        every broker is registered and a controller leads the quorum."""
        java_major()
        self._libs, _ = fetch(self.settings)
        self.cluster_id = "-"
        while self.cluster_id.startswith("-"):  # the tool would take it for an option
            self.cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        voters = ",".join(f"{i}@{HOST}:{n.cport}" for i, n in self.nodes.items())
        for node in self.nodes.values():
            for port in (node.port, node.cport):
                if _answers(HOST, port):
                    raise ServiceError(f"port {HOST}:{port} is already in use")
            data = node.home / "data"
            data.mkdir(parents=True, exist_ok=True)
            node.props.write_text(
                SERVER.format(
                    node_id=node.node_id,
                    voters=voters,
                    host=HOST,
                    port=node.port,
                    cport=node.cport,
                    data=data,
                    # three nodes: the fault tests' 3 and 2; one node (a broker a test may
                    # stop, tests/producers/slurm/test_jobcomp_live.py): 1 and 1
                    rf=min(3, len(self.nodes)),
                    isr=min(2, len(self.nodes)),
                )
            )
            (node.home / "log4j2.properties").write_text(LOG4J2.format(log=node.log_file))
            fmt = subprocess.run(
                [
                    *self._java("256m", node.home / "log4j2.properties"),
                    "kafka.tools.StorageTool",
                    "format",
                    "-t",
                    self.cluster_id,
                    "-c",
                    str(node.props),
                    "--ignore-formatted",
                ],
                capture_output=True,
                text=True,
                timeout=180,
                check=False,
            )
            if fmt.returncode != 0:
                raise ServiceError(
                    f"formatting node {node.node_id} failed:\n{fmt.stdout}{fmt.stderr}"
                )
        for node_id in self.nodes:
            self._launch(node_id)
        self.wait_ready()

    def _launch(self, node_id: int) -> None:
        node = self.nodes[node_id]
        if node.alive():
            raise ServiceError(f"node {node_id} is already running")
        with open(node.home / "stdout.log", "ab") as out:
            node.proc = subprocess.Popen(
                [
                    *self._java(log4j=node.home / "log4j2.properties"),
                    "kafka.Kafka",
                    str(node.props),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def wait_ready(self, node_ids: list[int] | None = None) -> None:
        """Every node in ``node_ids`` (default: all) answers metadata with a controller, and
        the cluster lists them all as brokers."""
        wanted = sorted(node_ids or self.nodes)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            for i in wanted:
                proc = self.nodes[i].proc
                if proc is not None and proc.poll() is not None:
                    node = self.nodes[i]
                    raise ServiceError(
                        f"Kafka node {i} exited with code {proc.returncode} while starting:\n"
                        + _tail(node.home / "stdout.log")
                        + _tail(node.log_file)
                    )
            if all(broker_ready(self.nodes[i].address) for i in wanted) and set(
                self.broker_ids()
            ) >= set(wanted):
                return
            time.sleep(0.5)
        raise ServiceError(f"Kafka nodes {wanted} not ready within {self.start_timeout_s:.0f}s")

    def stop_node(self, node_id: int, timeout_s: float = 60.0) -> float:
        """SIGTERM (a controlled shutdown: leadership moves first); returns once the process
        has exited, with the seconds that took."""
        return self._signal(node_id, signal.SIGTERM, timeout_s)

    def kill_node(self, node_id: int) -> float:
        """SIGKILL: no controlled shutdown, the cluster finds out by the missed heartbeats."""
        return self._signal(node_id, signal.SIGKILL, 30.0)

    def _signal(self, node_id: int, sig: int, timeout_s: float) -> float:
        node = self.nodes[node_id]
        t0 = time.monotonic()
        if node.proc is None or node.proc.poll() is not None:
            return 0.0
        node.proc.send_signal(sig)
        try:
            node.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            node.proc.kill()
            node.proc.wait(timeout=30)
            raise ServiceError(
                f"Kafka node {node_id} did not exit within {timeout_s:.0f}s of signal {sig}"
            ) from None
        return time.monotonic() - t0

    def start_node(self, node_id: int, wait: bool = True) -> None:
        """Start a stopped node again: the same data directory, the same ports."""
        self._launch(node_id)
        if wait:
            self.wait_ready([node_id])

    def stop(self) -> None:
        """Stop every node still running (SIGTERM, then SIGKILL after a short wait): all of
        them at once, a controlled shutdown of the last ones would wait for a quorum."""
        running = [n for n in self.nodes.values() if n.proc is not None and n.proc.poll() is None]
        for n in running:
            with contextlib.suppress(ProcessLookupError):
                n.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        deadline = time.monotonic() + 15
        for n in running:
            assert n.proc is not None
            try:
                n.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                n.proc.kill()
                n.proc.wait(timeout=30)

    def __enter__(self) -> KafkaCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- what the cluster says ---------------------------------------------------------

    def _admin(self, call: Any) -> Any:
        """Run ``call(admin)`` on an aiokafka admin client over every node's address."""
        from aiokafka.admin import AIOKafkaAdminClient
        from aiokafka.errors import KafkaError

        async def go() -> Any:
            # only the running nodes: the client asks a random broker of the metadata, which
            # may still list one that was just stopped; that answer is retried
            alive = [n.address for n in self.nodes.values() if n.alive()]
            admin = AIOKafkaAdminClient(bootstrap_servers=",".join(alive), request_timeout_ms=5000)
            try:
                await asyncio.wait_for(admin.start(), 15)
                return await asyncio.wait_for(call(admin), 20)
            finally:
                await admin.close()

        for attempt in range(10):
            try:
                return asyncio.run(go())
            except (KafkaError, TimeoutError, OSError):
                if attempt == 9:
                    raise
                time.sleep(0.3)
        raise AssertionError("unreachable")

    def broker_ids(self) -> list[int]:
        """The brokers the metadata lists (registered and not fenced)."""
        try:
            cluster = self._admin(lambda a: a.describe_cluster())
        except Exception:
            return []
        return sorted(b["node_id"] for b in cluster.get("brokers") or ())

    def describe(self, topics: list[str] | None = None) -> list[dict[str, Any]]:
        """aiokafka's describe_topics: each topic's partitions with leader, replicas, isr."""
        result: list[dict[str, Any]] = self._admin(lambda a: a.describe_topics(topics))
        return result

    def leader_of(self, topic: str, partition: int = 0) -> int:
        """The node that leads ``topic``'s ``partition`` now (-1: none)."""
        for d in self.describe([topic]):
            for p in d.get("partitions") or ():
                if p["partition"] == partition:
                    return int(p["leader"])
        raise ServiceError(f"{topic}[{partition}] is not in the metadata")

    def under_replicated(self) -> list[tuple[str, int, list[int]]]:
        """Partitions (every topic, internal ones too) whose ISR lacks a replica or that have no
        leader: (topic, partition, isr)."""
        out = []
        for d in self.describe():
            for p in d.get("partitions") or ():
                isr = sorted(p.get("isr") or ())
                if p.get("leader", -1) < 0 or isr != sorted(p.get("replicas") or ()):
                    out.append((d["topic"], p["partition"], isr))
        return out

    def wait_fully_replicated(self, timeout_s: float = 120.0) -> float:
        """Return once every partition has its whole replica set in sync (seconds waited)."""
        t0 = time.monotonic()
        last: list[tuple[str, int, list[int]]] = []
        while time.monotonic() - t0 < timeout_s:
            try:
                last = self.under_replicated()
                if not last:
                    return time.monotonic() - t0
            except Exception as exc:  # a node between states: ask again
                last = [(repr(exc), -1, [])]
            time.sleep(0.5)
        raise ServiceError(f"partitions still under-replicated after {timeout_s:.0f}s: {last[:5]}")

    def quorum(self) -> dict[str, Any]:
        """The KRaft quorum as the DescribeQuorum API gives it (what ``kafka-metadata-quorum
        describe --status`` prints): leader_id, leader_epoch, high_watermark, current_voters
        and observers (each (replica_id, log_end_offset)). Asked of a broker, which forwards
        it to the active controller."""
        from aiokafka.errors import for_code

        async def ask(admin: Any) -> Any:
            return await admin._send_request(_DescribeQuorum())

        response = self._admin(ask)
        if response.error_code:
            raise ServiceError(f"DescribeQuorum: {for_code(response.error_code).__name__}")
        [(_, [partition])] = [(t[0], t[1]) for t in response.topics]
        _, error, leader, epoch, hw, voters, observers, _ = partition
        if error:
            raise ServiceError(f"DescribeQuorum: {for_code(error).__name__}")
        return {
            "leader_id": leader,
            "leader_epoch": epoch,
            "high_watermark": hw,
            "current_voters": [(v[0], v[1]) for v in voters],
            "observers": [(o[0], o[1]) for o in observers],
        }

    def controller_id(self) -> int:
        """The active KRaft controller (the quorum's leader)."""
        leader = int(self.quorum()["leader_id"])
        if leader < 0:
            raise ServiceError("the KRaft quorum has no leader")
        return leader


# DescribeQuorum (API key 55) v0, which aiokafka does not define: flexible from v0 (compact
# strings and arrays, tagged fields). Kafka's DescribeQuorumRequest.json/...Response.json.
def _protocol() -> tuple[type[Any], type[Any]]:
    from aiokafka.protocol.api import Request, RequestStruct, Response
    from aiokafka.protocol.types import (
        CompactArray,
        CompactString,
        Int16,
        Int32,
        Int64,
        Schema,
        TaggedFields,
    )

    replica = (("replica_id", Int32), ("log_end_offset", Int64), ("tags", TaggedFields))

    class DescribeQuorumResponse_v0(Response):
        API_KEY = 55
        API_VERSION = 0
        SCHEMA = Schema(
            ("error_code", Int16),
            (
                "topics",
                CompactArray(
                    ("topic_name", CompactString("utf-8")),
                    (
                        "partitions",
                        CompactArray(
                            ("partition_index", Int32),
                            ("error_code", Int16),
                            ("leader_id", Int32),
                            ("leader_epoch", Int32),
                            ("high_watermark", Int64),
                            ("current_voters", CompactArray(*replica)),
                            ("observers", CompactArray(*replica)),
                            ("tags", TaggedFields),
                        ),
                    ),
                    ("tags", TaggedFields),
                ),
            ),
            ("tags", TaggedFields),
        )

    class DescribeQuorumRequest_v0(RequestStruct):
        FLEXIBLE_VERSION = True
        API_KEY = 55
        API_VERSION = 0
        RESPONSE_TYPE = DescribeQuorumResponse_v0
        SCHEMA = Schema(
            (
                "topics",
                CompactArray(
                    ("topic_name", CompactString("utf-8")),
                    (
                        "partitions",
                        CompactArray(("partition_index", Int32), ("tags", TaggedFields)),
                    ),
                    ("tags", TaggedFields),
                ),
            ),
            ("tags", TaggedFields),
        )

    class DescribeQuorum(Request[DescribeQuorumRequest_v0]):
        API_KEY = 55

        def build(self, request_struct_class: type[Any]) -> Any:
            return request_struct_class([("__cluster_metadata", [(0, {})], {})], {})

    return DescribeQuorum, DescribeQuorumResponse_v0


def _DescribeQuorum() -> Any:
    return _protocol()[0]()
