#!/usr/bin/env bash
# amd-check.sh: check the AMD node agent on a real AMD GPU node in about a minute, and record
# the raw outputs that gpugap's fakes are built from (tests/fixtures/amd/).
#
# 1. Prints the versions that must match: ROCm, amd-smi, the amdsmi Python package.
# 2. Records into OUTDIR: `amd-smi version/list/static/metric/partition/process --json`,
#    `amd-smi monitor -putm`, and what the Python package itself returns per processor handle
#    (amdsmi_py_idle.json, and amdsmi_py_load.json + amdsmi_process_load.json in the middle
#    of the load: does a compute process's engine_usage.gfx move at all?).
# 3. Runs `gpugap produce amdsmi` for DURATION s (a tick every INTERVAL s) writing JSON lines,
#    puts a small load on one GPU from LOAD_START to LOAD_END s (torch on ROCm: matmuls plus
#    a 4 GiB buffer), then prints one row per tick and device and whether activity rose.
#
#   deploy/amd-check.sh [OUTDIR]     (default: ./amd-check-<host>-<UTC time>; kept afterwards)
#   env: PYTHON (python3), DURATION (60), INTERVAL (2), LOAD_START (20), LOAD_END (40),
#        GPU (0: the device index to load, as torch/HIP numbers it)
#
# gpugap and the amdsmi package of this host's ROCm must be importable by $PYTHON
# (pip install /opt/rocm/share/amd_smi). Send OUTDIR back to gpugap's maintainers: it holds
# host names, PCI addresses, serial numbers and process names; look through it first.
# Exit status: 0 activity rose under load (or no torch: nothing to compare), 1 it did not,
# 2 the agent failed (no driver, wrong amdsmi/ROCm pairing: its own message is printed).
set -u
PY=${PYTHON:-python3} DURATION=${DURATION:-60} INTERVAL=${INTERVAL:-2}
LOAD_START=${LOAD_START:-20} LOAD_END=${LOAD_END:-40} GPU=${GPU:-0}
OUT=${1:-amd-check-$(hostname -s)-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT" || exit 2
JSONL=$OUT/samples.jsonl
rm -f "$JSONL"  # the agent appends
export PYTHONUNBUFFERED=1

echo "== versions"
cat /opt/rocm/.info/version 2>/dev/null | sed 's/^/ROCm /'
"$PY" -c 'import gpugap; from importlib.metadata import version as v, PackageNotFoundError
try:
    amd = v("amdsmi")
except PackageNotFoundError:
    amd = "NOT INSTALLED (pip install /opt/rocm/share/amd_smi)"
print("gpugap", gpugap.__version__ + ", amdsmi package", amd)' || exit 2

record() {  # record FILE CMD...: stdout to FILE, stderr beside it; a failure is noted, not fatal
    local file=$1; shift
    if ! "$@" >"$OUT/$file" 2>"$OUT/$file.err"; then echo "  (failed: $*; see $file.err)"; fi
    [ -s "$OUT/$file.err" ] || rm -f "$OUT/$file.err"
}
if command -v amd-smi >/dev/null; then
    amd-smi version 2>&1 | head -3
    echo "== recording amd-smi outputs into $OUT"
    record amdsmi_version.json amd-smi version --json
    record amdsmi_list.json amd-smi list --json
    record amdsmi_static.json amd-smi static --json
    record amdsmi_metric.json amd-smi metric --json
    record amdsmi_partition.json amd-smi partition --json
    record amdsmi_process.json amd-smi process --json
    record amdsmi_monitor_putm.txt amd-smi monitor -putm
else
    echo "amd-smi not on PATH: no CLI outputs recorded"
fi

# What the Python package returns per handle, as is ("N/A" strings, nested lists), one JSON.
dump_py() {
    "$PY" - "$1" <<'EOF'
import json, sys
from importlib.metadata import PackageNotFoundError, version
try:
    import amdsmi
except Exception as exc:  # a wrong amdsmi/ROCm pairing fails here; the agent explains it
    sys.exit(f"  no Python dump: import amdsmi: {type(exc).__name__}: {exc}")
CALLS = ("amdsmi_get_gpu_device_uuid", "amdsmi_get_gpu_device_bdf", "amdsmi_get_gpu_asic_info",
         "amdsmi_get_gpu_compute_partition", "amdsmi_get_gpu_memory_partition",
         "amdsmi_get_gpu_kfd_info", "amdsmi_get_gpu_activity", "amdsmi_get_gpu_vram_usage",
         "amdsmi_get_power_info", "amdsmi_get_energy_count", "amdsmi_get_gpu_metrics_info",
         "amdsmi_get_gpu_partition_metrics_info", "amdsmi_get_gpu_process_list")
amdsmi.amdsmi_init(amdsmi.AmdSmiInitFlags.INIT_AMD_GPUS)
try:
    package = version("amdsmi")
except PackageNotFoundError:  # a copy beside the script, not pip-installed
    package = "unknown"
out = {"amdsmi_package": package, "handles": []}
try:
    for i, h in enumerate(amdsmi.amdsmi_get_processor_handles()):
        got = {"index": i}
        for name in CALLS:
            fn = getattr(amdsmi, name, None)
            if fn is None:
                got[name] = {"absent": "not in this package"}
                continue
            try:
                got[name] = fn(h)
            except Exception as exc:  # AmdSmiLibraryException: keep its code and text
                got[name] = {"raised": type(exc).__name__, "err_code": getattr(exc, "err_code", None),
                             "text": " ".join(str(exc).split())}
        out["handles"].append(got)
finally:
    amdsmi.amdsmi_shut_down()
with open(sys.argv[1], "w") as fh:
    json.dump(out, fh, indent=2, default=str)
print(f"  {sys.argv[1]}: {len(out['handles'])} handles")
EOF
}
dump_py "$OUT/amdsmi_py_idle.json" 2>&1 | tail -3

echo "== the agent, once: gpugap produce amdsmi --once"
if ! "$PY" -m gpugap produce amdsmi --once --out "$OUT/once.jsonl" 2>"$OUT/once.log"; then
    cat "$OUT/once.log" >&2; exit 2
fi
echo "  $(wc -c <"$OUT/once.jsonl") bytes, $("$PY" -c "import json,sys
print(len(json.loads(open(sys.argv[1]).readline())['value']['gpus']))" "$OUT/once.jsonl") devices"

echo "== the agent: $DURATION s, a tick every $INTERVAL s; load on GPU $GPU from $LOAD_START to $LOAD_END s"
T0=$("$PY" -c 'import time; print(time.time())')
"$PY" -m gpugap produce amdsmi --interval "$INTERVAL" --out "$JSONL" 2>"$OUT/agent.log" &
AGENT=$!

T0=$T0 GPU=$GPU A=$LOAD_START B=$LOAD_END "$PY" - >"$OUT/load.log" 2>&1 <<'EOF' &
import json, os, time
t0, a, b = float(os.environ["T0"]), float(os.environ["A"]), float(os.environ["B"])
times = {}
try:
    import torch
    assert torch.cuda.is_available() and torch.version.hip, "torch sees no ROCm device"
except Exception as exc:  # no torch, or a CUDA build: no load
    times["skipped"] = f"{type(exc).__name__}: {exc}"
else:
    time.sleep(max(0.0, t0 + a - time.time()))
    try:
        times["init"] = time.time()
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
    except Exception as exc:
        times = {"skipped": f"load failed: {type(exc).__name__}: {exc}"}
print(json.dumps(times))
EOF
LOADER=$!

sleep 3
if ! kill -0 "$AGENT" 2>/dev/null; then  # no driver, wrong pairing...: its own message
    cat "$OUT/agent.log" >&2; kill "$LOADER" 2>/dev/null; exit 2
fi
MID=$("$PY" -c "import time; print(max(0, $T0 + ($LOAD_START + $LOAD_END) / 2 - time.time()))")
sleep "$MID"
dump_py "$OUT/amdsmi_py_load.json" 2>&1 | tail -3
command -v amd-smi >/dev/null && record amdsmi_process_load.json amd-smi process --json
sleep "$("$PY" -c "import time; print(max(0, $T0 + $DURATION - time.time()))")"
kill -TERM "$AGENT"; wait "$AGENT"; AGENT_RC=$?
wait "$LOADER"
echo "agent exit status $AGENT_RC; its log ($OUT/agent.log): $(wc -l <"$OUT/agent.log") lines"
sed 's/^/  /' "$OUT/agent.log" | head -20

T0=$T0 INTERVAL=$INTERVAL GPU=$GPU "$PY" - "$JSONL" "$OUT/load.log" <<'EOF'
import json, os, sys
from datetime import datetime
from statistics import mean
t0, dt, loaded = float(os.environ["T0"]), float(os.environ["INTERVAL"]), int(os.environ["GPU"])
lines = open(sys.argv[2]).read().strip().splitlines()
load = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {"skipped": " ".join(lines)}
if not os.path.exists(sys.argv[1]) or not os.path.getsize(sys.argv[1]):
    sys.exit("RESULT: the agent wrote no samples (see its log above)")

def num(v, fmt, width=0):
    return ("-" if v is None else format(v, fmt)).rjust(width)

def phase(t):
    if "start" not in load or t < load["init"] or t > load["end"] + dt:
        return "idle"
    return "LOAD" if load["start"] + dt <= t <= load["end"] else "edge"

print(f"{'t_s':>5} {'idx':>3} {'activity':>8} {'metric':>13} {'mem_used/total':>16} "
      f"{'power_W':>7} phase  measured_use / unsupported")
act = {"idle": [], "LOAD": []}
for line in open(sys.argv[1]):
    s = json.loads(line)["value"]
    t = datetime.fromisoformat(s["time"].replace("Z", "+00:00")).timestamp()
    for g in s["gpus"]:
        ph = phase(t) if g["index"] == loaded else "-"
        if ph in act and g.get("activity") is not None:
            act[ph].append(g["activity"])
        mu = g.get("measured_use")
        mu = "None" if mu is None else ";".join(
            f"{(u.get('pod_uid') or 'no-pod')[:8]}={u['activity']:.2f}" for u in mu) or "()"
        mem = f"{num(g.get('memory_used_mib'), '.0f')}/{num(g.get('memory_total_mib'), '.0f')}"
        print(f"{t - t0:5.1f} {g['index']:>3} {num(g.get('activity'), '.2f', 8)} "
              f"{g.get('activity_metric') or '-':>13} {mem:>16} {num(g.get('power_w'), '.0f', 7)} "
              f"{ph:<6} {mu} / {','.join(g['unsupported'])}  {g['uuid']}")
print("load: " + (f"{load['matmuls']} bf16 matmuls on device {loaded}" if "start" in load
                  else f"none ({load['skipped']})"))
if "start" not in load or not act["idle"] or not act["LOAD"]:
    print("RESULT: nothing to compare"); sys.exit(0)
risen = mean(act["LOAD"]) >= mean(act["idle"]) + 0.3
print(f"RESULT: activity {'ROSE' if risen else 'did NOT rise'} under load on device {loaded} "
      f"(idle mean {mean(act['idle']):.2f}, load mean {mean(act['LOAD']):.2f})")
sys.exit(0 if risen else 1)
EOF
RC=$?
echo "recorded outputs: $OUT"
exit $RC
