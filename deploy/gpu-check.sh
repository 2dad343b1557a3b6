#!/usr/bin/env bash
# gpu-check.sh: check the NVML agent on a real GPU node in about a minute.
#
# Runs `gpugap produce nvml` for DURATION s (one tick every INTERVAL s) writing JSON lines,
# puts a small load on one GPU from LOAD_START to LOAD_END s (torch matmuls plus a 4 GiB
# buffer), then prints one row per tick and GPU and a summary: activity, power and memory
# while idle vs under load, and what the agent measured of the load's own process (measured
# use per process: NVML process utilization). Without torch there is no load, and the
# summary says so.
#
#   deploy/gpu-check.sh [FILE.jsonl]        (default: a temporary file, removed afterwards)
#   env: PYTHON (python3), DURATION (60), INTERVAL (1), LOAD_START (20), LOAD_END (40),
#        GPU (0: the NVML index to load; CUDA is told to number GPUs in PCI order as NVML does)
#
# The agent must be importable by $PYTHON (gpugap installed, or PYTHONPATH=<checkout>).
# Exit status: 0 activity rose under load (or no torch: nothing to compare), 1 it did not,
# 2 the agent failed (e.g. no NVIDIA driver: its own message is printed).
set -u
PY=${PYTHON:-python3} DURATION=${DURATION:-60} INTERVAL=${INTERVAL:-1}
LOAD_START=${LOAD_START:-20} LOAD_END=${LOAD_END:-40} GPU=${GPU:-0}
WORK=$(mktemp -d) && trap 'rm -rf "$WORK"' EXIT
JSONL=${1:-$WORK/samples.jsonl}
rm -f "$JSONL"  # the agent appends
export CUDA_DEVICE_ORDER=PCI_BUS_ID PYTHONUNBUFFERED=1

command -v nvidia-smi >/dev/null &&
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
"$PY" -c 'import gpugap, pynvml; from importlib.metadata import version as v
print("gpugap", gpugap.__version__ + ", nvidia-ml-py", v("nvidia-ml-py"))' || exit 2

T0=$("$PY" -c 'import time; print(time.time())')
"$PY" -m gpugap produce nvml --interval "$INTERVAL" --out "$JSONL" 2>"$WORK/agent.log" &
AGENT=$!

# The load: import torch now (CPU only), touch the GPU at LOAD_START, stop at LOAD_END.
# Its last line is a JSON object of its times (epoch s) for the summary.
T0=$T0 GPU=$GPU A=$LOAD_START B=$LOAD_END "$PY" - >"$WORK/load.log" 2>&1 <<'EOF' &
import json, os, time
t0, a, b = float(os.environ["T0"]), float(os.environ["A"]), float(os.environ["B"])
times = {}
try:
    import torch
    assert torch.cuda.is_available(), "torch sees no CUDA device"
except Exception as exc:  # no torch or no CUDA: no load
    times["skipped"] = f"{type(exc).__name__}: {exc}"
else:
    time.sleep(max(0.0, t0 + a - time.time()))
    try:
        times["cuda_init"] = time.time()
        dev = torch.device(f"cuda:{os.environ['GPU']}")
        hold = torch.empty(4 << 30, dtype=torch.uint8, device=dev)  # 4 GiB: memory must rise
        x = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
        torch.cuda.synchronize(dev)
        times["start"], n = time.time(), 0
        while time.time() < t0 + b:
            for _ in range(20):
                y = x @ x
            torch.cuda.synchronize(dev)
            n += 20
        times["end"], times["matmuls"] = time.time(), n
    except Exception as exc:  # e.g. the GPU is full or busy elsewhere
        times = {"skipped": f"load failed: {type(exc).__name__}: {exc}"}
print(json.dumps(times))
EOF
LOADER=$!

sleep 2
if ! kill -0 "$AGENT" 2>/dev/null; then  # no driver, bad config...: its own message
    cat "$WORK/agent.log" >&2; kill "$LOADER" 2>/dev/null; exit 2
fi
sleep "$("$PY" -c "import time; print(max(0, $T0 + $DURATION - time.time()))")"
kill -TERM "$AGENT"; wait "$AGENT"; AGENT_RC=$?
wait "$LOADER"
echo "agent exit status $AGENT_RC; its log: $(wc -l <"$WORK/agent.log") lines"
sed 's/^/  /' "$WORK/agent.log"

T0=$T0 INTERVAL=$INTERVAL GPU=$GPU "$PY" - "$JSONL" "$WORK/load.log" <<'EOF'
import json, os, sys
from datetime import datetime
from statistics import mean
t0, dt, loaded = float(os.environ["T0"]), float(os.environ["INTERVAL"]), int(os.environ["GPU"])
lines = open(sys.argv[2]).read().strip().splitlines()
load = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {"skipped": " ".join(lines)}

def phase(t: float, index: int) -> str:
    if index != loaded:
        return "-"  # not loaded by us; summed up as "all"
    if "start" not in load:
        return "idle"
    if t < load["cuda_init"] or t > load["end"] + dt:
        return "idle"
    return "LOAD" if load["start"] + dt <= t <= load["end"] else "edge"

def num(v, fmt: str, width: int = 0) -> str:
    return ("-" if v is None else format(v, fmt)).rjust(width)

if not os.path.exists(sys.argv[1]) or not os.path.getsize(sys.argv[1]):
    sys.exit("RESULT: the agent wrote no samples (see its log above)")
rows, last_energy = [], {}
print(f"{'t_s':>5} {'gpu':>3} {'activity':>8} {'mem_used/total MiB':>20} {'power_W':>7} "
      f"{'E_W':>6} {'sm_MHz':>6} phase  unsupported")
for line in open(sys.argv[1]):
    s = json.loads(line)["value"]
    t = datetime.fromisoformat(s["time"].replace("Z", "+00:00")).timestamp()
    for g in s["gpus"]:
        key, e = g["uuid"], g.get("energy_mj")
        prev = last_energy.get(key)
        e_w = (e - prev[1]) / 1000 / (t - prev[0]) if e is not None and prev else None
        if e is not None:
            last_energy[key] = (t, e)  # E_W: power from the energy counter, for comparison
        ph = phase(t, g["index"])
        rows.append((g["index"], ph, {**g, "e_w": e_w}))
        mem = f"{num(g.get('memory_used_mib'), '.0f')}/{num(g.get('memory_total_mib'), '.0f')}"
        print(f"{t - t0:5.1f} {g['index']:>3} {num(g.get('activity'), '.2f', 8)} {mem:>20} "
              f"{num(g.get('power_w'), '.1f', 7)} {num(e_w, '.1f', 6)} "
              f"{num(g.get('sm_clock_mhz'), 'd', 6)} {ph:<6} {','.join(g['unsupported'])}")

print(f"\n{len(rows)} GPU readings; load: " + (
    f"GPU {loaded}, {load['matmuls']} bf16 4096^3 matmuls from t={load['start'] - t0:.1f} s "
    f"to t={load['end'] - t0:.1f} s (CUDA up at t={load['cuda_init'] - t0:.1f} s)"
    if "start" in load else f"none ({load['skipped']})"))
risen = None
for index in sorted({i for i, _, _ in rows}):
    print(f"GPU {index}:")
    for ph in ("idle", "LOAD", "-"):
        gs = [g for i, p, g in rows if i == index and p == ph]
        if not gs:
            continue
        def avg(f):
            vals = [g[f] for g in gs if g.get(f) is not None]
            return mean(vals) if vals else None
        mem = max((g["memory_used_mib"] for g in gs if g.get("memory_used_mib") is not None),
                  default=None)
        print(f"  {'all' if ph == '-' else ph:<4} n={len(gs):>3}  activity mean "
              f"{num(avg('activity'), '.2f')}  power mean {num(avg('power_w'), '.1f')} W "
              f"(energy counter {num(avg('e_w'), '.1f')} W)  memory used max "
              f"{num(mem, '.0f')} MiB  sm clock mean {num(avg('sm_clock_mhz'), '.0f')} MHz")
    if index == loaded and "start" in load:
        idle = [g.get("activity") for i, p, g in rows if i == index and p == "idle"]
        busy = [g.get("activity") for i, p, g in rows if i == index and p == "LOAD"]
        idle, busy = [a for a in idle if a is not None], [a for a in busy if a is not None]
        risen = mean(busy) >= mean(idle) + 0.3 if idle and busy else "no activity readings"
if "start" in load:  # measured use per process (GPUGAP_NVML_PROCESS_USE): the load is no pod's
    uses = [g.get("measured_use") for i, p, g in rows if i == loaded and p == "LOAD"]
    mine = [sum(u["activity"] for u in us if not u.get("pod_uid")) for us in uses if us]
    print(f"per-process use under load: {len(mine)} of {len(uses)} ticks measured"
          + (f", the load's process (no pod) at mean {mean(mine):.2f}" if mine else
             " (None: NotSupported, the agent without the host's /proc, or a MIG GPU)"))
if risen is None or isinstance(risen, str):
    print(f"RESULT: nothing to compare ({risen or 'no load ran, see above'})")
    risen = None
else:
    print(f"RESULT: activity {'ROSE' if risen else 'did NOT rise'} under load on GPU {loaded}")
sys.exit(0 if risen in (None, True) else 1)
EOF
