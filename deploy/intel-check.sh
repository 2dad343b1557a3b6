#!/usr/bin/env bash
# intel-check.sh: check the XPU Manager scraper on a real Intel GPU node, and record what the
# node's tools print so they can become test fixtures (tests/fixtures/intel/, SOURCES.md).
#
# Prints xpu-smi's and xpumd's versions, records `xpu-smi discovery -j`, a short
# `xpu-smi dump` and one scrape of the exporter into OUTDIR, then runs
# `gpugap produce xpum --once` against the exporter and prints what it made of each device
# (activity and its metric, memory, power, energy) beside xpu-smi's own dump.
#
#   deploy/intel-check.sh [OUTDIR]          (default: ./intel-check-<host>-<date>)
#   env: PYTHON (python3), URL (http://localhost:29999/metrics: XPU Manager 1.x's exporter;
#        2.x xpumd serves hw_* on its own port), TILES (0; 1: tiles as devices, FLAT),
#        DUMP_METRICS (0,1,5,18,31: 1.x ids: utilization, power, memory util, memory used,
#        compute engine group; 2.x numbers them differently, the CSV header says which)
#
# Both scrapes of the exporter (ours and the one recorded) take a turn of its statistics
# window (1.x: averages since the previous scrape), so run this where no Prometheus scrapes
# the same exporter at the same moment, or expect its numbers to cover a shorter window.
# Exit status: 0 the scraper produced a sample, 1 it did not, 2 nothing to scrape.
set -u
PY=${PYTHON:-python3} URL=${URL:-http://localhost:29999/metrics} TILES=${TILES:-0}
DUMP_METRICS=${DUMP_METRICS:-0,1,5,18,31}
OUT=${1:-./intel-check-$(hostname -s)-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT" || exit 2
echo "recording into $OUT"

if command -v xpu-smi >/dev/null; then
    xpu-smi -v 2>&1 | tee "$OUT/xpu-smi_version.txt"
    xpu-smi discovery -j >"$OUT/xpu-smi_discovery_j.json" 2>&1
    echo "xpu-smi discovery -j: $(wc -c <"$OUT/xpu-smi_discovery_j.json") bytes"
    # every device, 3 rows at 1 s; N/A and empty fields are what the tool printed
    timeout 30 xpu-smi dump -d -1 -m "$DUMP_METRICS" -i 1 -n 3 >"$OUT/xpu-smi_dump.csv" 2>&1 ||
        timeout 30 xpu-smi dump -d 0 -m "$DUMP_METRICS" -i 1 -n 3 >"$OUT/xpu-smi_dump.csv" 2>&1
    sed 's/^/  /' "$OUT/xpu-smi_dump.csv"
else
    echo "xpu-smi: not installed (install XPU Manager; the scrape below still runs)"
fi
command -v xpumd >/dev/null && { xpumd --version 2>&1 | head -3 | tee "$OUT/xpumd_version.txt"; }

if ! curl -fsS --max-time 10 "$URL" -o "$OUT/exporter_scrape.prom"; then
    echo "RESULT: no exporter answers at $URL (set URL=...)"
    exit 2
fi
echo "exporter scrape: $(wc -l <"$OUT/exporter_scrape.prom") lines;" \
    "families: $(grep -o '^\(xpum\|hw\)_[a-z_]*' "$OUT/exporter_scrape.prom" | sort -u | tr '\n' ' ')"

"$PY" -c 'import gpugap; print("gpugap", gpugap.__version__)' || exit 2
FLAGS=(--endpoint "$URL" --once --out "$OUT/samples.jsonl")
[ "$TILES" = 1 ] && FLAGS+=(--tiles-as-devices)
rm -f "$OUT/samples.jsonl"
"$PY" -m gpugap produce xpum "${FLAGS[@]}" 2>"$OUT/scraper.log"
echo "scraper exit status $?; its log:"
sed 's/^/  /' "$OUT/scraper.log"

"$PY" - "$OUT/samples.jsonl" <<'EOF'
import json, os, sys
path = sys.argv[1]
if not os.path.exists(path) or not os.path.getsize(path):
    sys.exit("RESULT: the scraper wrote nothing (see its log above)")
n = 0
for line in open(path):
    record = json.loads(line)
    value = record["value"]
    if "gpus" not in value:  # a dead letter
        print(f"dead letter ({value.get('kind')}): {value.get('reason')}")
        continue
    print(f"node {value['node']}, source {value['source']}")
    for g in value["gpus"]:
        n += 1
        act = g.get("activity")
        print(f"  {g['index']:>3} {g['uuid']} {g.get('model') or '-'}\n"
              f"      activity {'-' if act is None else f'{act:.3f}'} ({g.get('activity_metric')})"
              f" memory {g.get('memory_used_mib')} MiB power {g.get('power_w')} W"
              f" energy {g.get('energy_mj')} mJ unsupported {','.join(g['unsupported']) or '-'}")
sys.exit(0 if n else "RESULT: no device in the scraper's output")
EOF
RC=$?
echo "kept in $OUT: $(ls "$OUT" | tr '\n' ' ')"
echo "to make fixtures of them: copy into tests/fixtures/intel/ and add a SOURCES.md row"
exit $RC
