"""The checkpoint format holds still: a worker must restore what an earlier release wrote, and
the same input must snapshot to the same bytes (the snapshot topic is compacted per key, and a
changed encoding would rewrite every node).

snapshot_golden.json is what the worker wrote for ``records()`` (one open idle episode, merged
state, a partial gang, an orphaned end, ended allocations, learned pod GPUs). If the format
changes on purpose, old checkpoints must still restore: keep that working (keep the file as it
was, as the fixture of a test that restores it), then write the file again with
``.venv/bin/python -m tests.streams.test_snapshot_format``.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

from gpugap.schemas import AllocationEvent, K8sPodEvent, NodeSample
from gpugap.schemas.clock import ms
from gpugap.schemas.types import EventSource, PodEventKind, PodPhase
from gpugap.streams.core import CoreConfig
from gpugap.streams.detect_idle import IdleConfig
from gpugap.streams.join import Join
from gpugap.streams.process import Processor
from tests.streams.helpers import Null, T, gpu, pod, samples, slurm

GOLDEN = Path(__file__).with_name("snapshot_golden.json")
#: what 0.1.0 wrote (before alerts carried their idle policy): must restore too
GOLDEN_0_1 = Path(__file__).with_name("snapshot_golden_0.1.json")
#: what the worker wrote before pod attributions were spans of time (each GPU's last sample
#: time only, ``{uuid: ms}``): must restore too (``streams.state.upgrade_node_state``)
GOLDEN_BEFORE_SPANS = Path(__file__).with_name("snapshot_golden_before_spans.json")
#: what the worker wrote before GPU shares (idle runs without their GPU-equivalent seconds)
GOLDEN_BEFORE_SHARES = Path(__file__).with_name("snapshot_golden_before_shares.json")
#: what the worker wrote before nodes kept their sample gaps (the idle alerts' wait)
GOLDEN_BEFORE_GAPS = Path(__file__).with_name("snapshot_golden_before_gaps.json")
CFG = CoreConfig(idle=IdleConfig(minutes=3))
CUT = "10:16:00"  # the snapshot is taken after the records up to here

Item = NodeSample | AllocationEvent | K8sPodEvent


def gang_pod(uid: str, hms: str) -> K8sPodEvent:
    return K8sPodEvent(
        event_id=f"k8s/kube/{uid}/bound",
        kind=PodEventKind.BOUND,
        time=T(hms),
        source=EventSource.WATCH,
        cluster="kube",
        uid=uid,
        namespace="ml",
        name=f"w-{uid}",
        node="k1",
        phase=PodPhase.RUNNING,
        gpus=2,
        owner_kind="PyTorchJob",
        owner_name="ddp",
        owner="carol",
        team="nlp",
        gang_id="ml/ddp",
        gang_size=3,
    )


def records() -> list[Item]:
    recs: list[Item] = [
        slurm("1", "start", "10:00:00", (0, 1)),
        slurm("2", "start", "10:00:00", (3,)),
        slurm("2", "end", "10:02:00", (3,)),
        pod("u1", "start", "10:00:00"),
        pod("u2", "end", "10:01:00", name="q"),  # no start ever
        gang_pod("a", "10:00:00"),
        gang_pod("b", "10:00:05"),
    ]
    acts = {0: 0.0, 1: 0.0, 2: 0.7, 3: 0.2}
    recs += samples("10:00:10", "10:20:00", acts, attrib={2: ("ns", "p")})
    return sorted(recs, key=lambda r: r.time)


def up_to(cut: str) -> tuple[list[Item], list[Item]]:
    recs = records()
    n = sum(1 for r in recs if r.time <= T(cut))
    return recs[:n], recs[n:]


def feed(proc: Processor, recs: list[Item]) -> list[str]:
    """What the records make, as JSON lines (to compare runs)."""
    out = []
    for r in recs:
        res = proc.handle(r)
        res.add(proc.advance())
        items = [*res.minutes, *res.alerts, *res.allocations, *(x.record for x in res.refused)]
        out += [x.model_dump_json() for x in items]
    return out


def written(join: Join) -> dict[str, str]:
    """Every snapshot record of ``join`` (all nodes, changed or not), decompressed."""
    join._unstored[0] = set(join.proc.state["nodes"])  # as if no snapshot were stored yet
    items = join.snapshot({0: {"in:0": 7}})
    return {k.decode(): zlib.decompress(v).decode() for _, k, v in items}


def snapshot_now() -> tuple[Join, dict[str, str]]:
    join = Join(Null(), "", CFG)
    before, _ = up_to(CUT)
    feed(join.proc, before)
    return join, written(join)


def test_the_same_input_snapshots_to_the_same_bytes() -> None:
    _, got = snapshot_now()
    want = json.loads(GOLDEN.read_text())
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert got[key] == value, key


def test_a_checkpoint_written_before_restores_and_goes_on_alike() -> None:
    want = json.loads(GOLDEN.read_text())
    meta = json.loads(want["meta"])
    assert meta["merge"] and meta["gangs"]["gangs"], "the fixture should hold merged and gangs"
    node = json.loads(want["node:hpc/n1"])
    assert node["idle"]["episodes"] and node["ended"] and node["attrib"] and node["allocs"]

    restored = Join(Null(), "", CFG)
    offsets = restored.restore({k.encode(): zlib.compress(v.encode()) for k, v in want.items()})
    assert offsets == {0: {"in:0": 7}}
    assert written(restored) == want  # restored as it was written, byte for byte

    original, _ = snapshot_now()
    _, after = up_to(CUT)
    assert feed(restored.proc, after) == feed(original.proc, after)
    assert written(restored) == written(original)


def test_a_0_1_checkpoint_restores_and_goes_on_alike_but_for_the_policy() -> None:
    """0.1.0's merged alerts hold no ``policy``: restored, they go on as before, and the one
    alert built from the restored state alone (the merged resolve) lacks only its policy."""
    old = json.loads(GOLDEN_0_1.read_text())
    assert "policy" not in old["meta"]
    restored = Join(Null(), "", CFG)
    restored.restore({k.encode(): zlib.compress(v.encode()) for k, v in old.items()})
    original, _ = snapshot_now()
    _, after = up_to(CUT)
    got = [json.loads(x) for x in feed(restored.proc, after)]
    want = [json.loads(x) for x in feed(original.proc, after)]
    assert len(got) == len(want) and got
    differ = 0
    for g, w in zip(got, want, strict=True):
        if g.get("policy") != w.get("policy"):
            differ += 1
            assert g["policy"] is None and w["policy"]["minutes"] == 3
            g["policy"] = w["policy"] = None
        assert g == w
    assert differ <= 1


def test_a_checkpoint_from_before_attribution_spans_restores_and_goes_on_alike() -> None:
    old = json.loads(GOLDEN_BEFORE_SPANS.read_text())
    node = json.loads(old["node:hpc/n1"])
    assert node["attrib"] == {"ns/p": {gpu(2): ms(T("10:16:00"))}}  # the last sample time
    restored = Join(Null(), "", CFG)
    restored.restore({k.encode(): zlib.compress(v.encode()) for k, v in old.items()})
    # one span from the start of the pod of that name: it holds the GPU as before
    state = restored.proc.cores["hpc/n1"].state
    assert state["attrib"] == {"ns/p": {gpu(2): [[ms(T("10:00:00")), ms(T("10:16:00"))]]}}

    original, _ = snapshot_now()
    _, after = up_to(CUT)
    assert feed(restored.proc, after) == feed(original.proc, after)
    got, want = written(restored), written(original)
    assert got.keys() == want.keys()
    # the same state but for when that span began (not in the old checkpoint)
    first = f"[[{ms(T('10:00:00'))},"
    assert got["node:hpc/n1"] == want["node:hpc/n1"].replace(f"[[{ms(T('10:00:10'))},", first)
    assert all(got[k] == want[k] for k in want if k != "node:hpc/n1")


def test_a_checkpoint_from_before_shares_restores_and_goes_on_alike() -> None:
    """Idle runs were [start, minutes]: restored, they count whole GPUs (what they were) and
    gain their GPU-equivalent seconds at their next idle minute; alerts are the same."""
    old = json.loads(GOLDEN_BEFORE_SHARES.read_text())
    runs = json.loads(old["node:hpc/n1"])["idle"]["runs"]
    assert runs and all(len(r) == 2 for r in runs.values())
    restored = Join(Null(), "", CFG)
    restored.restore({k.encode(): zlib.compress(v.encode()) for k, v in old.items()})
    original, _ = snapshot_now()
    _, after = up_to(CUT)
    assert feed(restored.proc, after) == feed(original.proc, after)
    assert written(restored) == written(original)


def test_a_checkpoint_from_before_sample_gaps_restores_and_goes_on_alike() -> None:
    """A node restored without its sample gaps waits its stated interval until it has seen
    some (10 s here: the alert lateness rules); its next samples fill them in."""
    old = json.loads(GOLDEN_BEFORE_GAPS.read_text())
    assert "gaps" not in json.loads(old["node:hpc/n1"])
    restored = Join(Null(), "", CFG)
    restored.restore({k.encode(): zlib.compress(v.encode()) for k, v in old.items()})
    original, _ = snapshot_now()
    _, after = up_to(CUT)
    assert feed(restored.proc, after) == feed(original.proc, after)
    assert written(restored) == written(original)


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(snapshot_now()[1], indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")


def test_packed_state_reads_back_exactly() -> None:
    from gpugap.streams.checkpoint import pack, unpack

    state = {
        "floats": [1e-05, 2.5e-07, 0.1, 1e16, 123456789.123, 0.0, -3.75],
        "ints": [0, 2**53 + 1, -(2**40)],
        "names": ["ü-node", "名前", 'quote " and \\ backslash', "\u2028"],
        "nested": {"a": [None, True, False, {"b": []}]},
    }
    packed = pack(state)
    assert unpack(packed) == state
    assert zlib.decompress(packed).isascii()  # non-ASCII escaped, as json.dumps does
    assert pack(state) == packed  # the same state, the same bytes
