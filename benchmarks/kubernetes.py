"""Benchmark of the Kubernetes producer: an initial list of 50,000 pods, then a burst of 10,000
watch events, through the test API server (in a child process, as a real API server is
elsewhere: it must not share the producer's GIL) and the real kubernetes client. The load and
its measure are tests/harness/k8s_load.py (tests/producers/kubernetes/test_kubernetes.py runs
it small).

    python -m benchmarks.kubernetes [--pods 50000] [--burst 10000] [--repeats 3]

Pods are realistic objects (~3 kB of JSON: labels, owner reference, resources, probes,
volumes, conditions, container statuses); 80% request GPUs. Owners: Deployments (with their
ReplicaSets), Jobs and PyTorchJobs, ~50 pods each, all fetched over HTTP once. Output goes
through the JSONL publisher to a file. The burst: 2,500 new pods bound and running (2 events
each), 2,500 Job pods completing, 2,500 deletions, 2,500 status updates that matter to nobody.
"""

from __future__ import annotations

import argparse
import resource
import statistics

from tests.harness.k8s_load import measure


def main(pods: int = 50_000, burst: int = 10_000, repeats: int = 3) -> int:
    runs = [measure(pods, burst) for _ in range(repeats)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    list_s, burst_s = med["list_s"], med["burst_s"]
    print(f"kubernetes producer: median of {repeats}, JSONL output, API server in its own process")
    print(
        f"initial list  {pods:>7,} pods ({int(pods * 0.8):,} with GPUs) -> "
        f"{med['list_events']:>7,.0f} events in {list_s:6.2f} s: "
        f"{pods / list_s:>8,.0f} pods/s {med['list_events'] / list_s:>8,.0f} events/s "
        f"({med['owner_gets']:,.0f} owner GETs)"
    )
    print(
        f"watch burst   {burst:>7,} watch events -> {med['burst_events']:>7,.0f} events in "
        f"{burst_s:6.2f} s: {burst / burst_s:>8,.0f} watch events/s "
        f"{med['burst_events'] / burst_s:>8,.0f} events/s"
    )
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"producer process peak RSS {rss_mib:,.0f} MiB (the API server runs in another process)")
    print(
        f"keeps up: the burst was published {burst_s:.1f} s after it reached the API server; "
        f"capacity {burst / burst_s * 3600:,.0f} pod changes/hour "
        f"({burst / burst_s * 3600 / pods:,.0f} per pod per hour at {pods:,} pods)"
    )
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, default=50_000)
    ap.add_argument("--burst", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    raise SystemExit(main(a.pods, a.burst, a.repeats))
