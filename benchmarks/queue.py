"""``python -m benchmarks queue``: a 30-day partition of 50,000 jobs replayed through the
backfill model twice (the limits asked for, then right-sized by the ``--time`` rule), and
the per-user replays for the most padded users.

The job mix is synthetic and seeded: ``--users`` users with a few job families each; GPUs per
job 1, 2, 4 or 8 on one node, some 2-4 node jobs of 8; log-normal run times (median ~40
min); users ask for their family's typical run time x 1.5-12, rounded up to the hour (the
padding jobstats and Job Defense Shield report), a few exact askers; submissions spread over
``--days`` at a load near the partition's capacity. Prints the seconds each replay took and
the figures side by side.
"""

from __future__ import annotations

import argparse
import math
import random
import time
from collections.abc import Sequence

from gpugap.queue.backfill import Partition, QueuedJob, replay
from gpugap.queue.cost import figures, queue_cost, right_size, right_sized_limits

DAY = 86400.0


def job_mix(
    n: int, days: float, users: int, p: Partition, *, load: float, seed: int
) -> list[QueuedJob]:
    rnd = random.Random(seed)
    fams = []
    for u in range(users):
        for f in range(rnd.randint(1, 4)):
            gpn = rnd.choice([1, 1, 2, 4, 8, 8]) if rnd.random() > 0.05 else p.gpus_per_node
            nodes = rnd.choice([2, 4]) if gpn == p.gpus_per_node and rnd.random() < 0.2 else 1
            median = math.exp(rnd.gauss(math.log(2400), 0.8))
            pad = 1.0 if rnd.random() < 0.15 else rnd.uniform(1.5, 12)
            fams.append(
                (f"u{u:03d}", f"u{u:03d}/f{f}", nodes, min(gpn, p.gpus_per_node), median, pad)
            )
    drafts = []
    for i in range(n):
        user, fam, nodes, gpn, median, pad = rnd.choice(fams)
        run = max(60.0, median * math.exp(rnd.gauss(0, 0.4)))
        limit = (
            math.ceil(median * pad * 1.3 / 3600) * 3600.0 if pad > 1 else math.ceil(run / 60) * 60.0
        )
        drafts.append((i, user, fam, nodes, gpn, min(run, limit), limit))
    gpu_s = sum(nodes * gpn * run for _, _, _, nodes, gpn, run, _ in drafts)
    # run times scaled so that the jobs offer ``load`` of the partition over ``days``
    k = load * p.nodes * p.gpus_per_node * days * DAY / gpu_s
    out = []
    for i, user, fam, nodes, gpn, run, asked in drafts:
        day = rnd.randrange(int(days))
        # two in three submitted in working hours (8-20 h): the queue builds by day
        hour = rnd.uniform(8, 20) if rnd.random() < 2 / 3 else rnd.uniform(0, 24)
        at = min(day * DAY + hour * 3600, days * DAY)
        limit = (
            math.ceil(asked * k / 3600) * 3600.0 if asked > run else math.ceil(run * k / 60) * 60.0
        )
        out.append(
            QueuedJob(f"j{i}", at, nodes, gpn, limit, min(run * k, limit), user=user, family=fam)
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks queue", description=__doc__)
    ap.add_argument("--jobs", type=int, default=50_000)
    ap.add_argument("--days", type=float, default=30.0)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--users", type=int, default=200)
    ap.add_argument("--load", type=float, default=0.95, help="offered GPU-hours / capacity")
    ap.add_argument("--top-users", type=int, default=3, help="per-user replays (0: none)")
    ap.add_argument("--repeats", type=int, default=3, help="jittered replays of each variant")
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args(argv)
    p = Partition(a.nodes, a.gpus_per_node)
    jobs = job_mix(a.jobs, a.days, a.users, p, load=a.load, seed=a.seed)
    span = max(j.submit_s for j in jobs) / DAY
    print(
        f"partition {p.nodes} nodes x {p.gpus_per_node} GPUs; {len(jobs):,} jobs submitted over "
        f"{span:.1f} days by {a.users} users (offered load {a.load:.0%})"
    )
    t = time.perf_counter()
    asked = figures(jobs, replay(jobs, p))
    t_asked = time.perf_counter() - t
    t = time.perf_counter()
    sized_jobs = right_size(jobs, right_sized_limits(jobs))
    sized = figures(sized_jobs, replay(sized_jobs, p))
    t_sized = time.perf_counter() - t
    changed = sum(1 for x, y in zip(jobs, sized_jobs, strict=True) if y.limit_s < x.limit_s)
    print(f"{'':24}{'as asked':>14}{'right-sized':>14}")
    for name, f in [
        ("replay seconds", lambda q, s: (t_asked, t_sized)),
        ("GPU-hours waited", lambda q, s: (q.gpu_h_waited, s.gpu_h_waited)),
        ("mean wait (h)", lambda q, s: (q.mean_wait_s / 3600, s.mean_wait_s / 3600)),
        ("p95 wait (h)", lambda q, s: (q.p95_wait_s / 3600, s.p95_wait_s / 3600)),
        ("makespan (days)", lambda q, s: (q.makespan_s / DAY, s.makespan_s / DAY)),
        ("jobs backfilled", lambda q, s: (q.backfilled, s.backfilled)),
    ]:
        x, y = f(asked, sized)
        print(f"{name:24}{x:>14,.2f}{y:>14,.2f}")
    print(f"jobs right-sized: {changed:,} of {len(jobs):,}")
    if a.repeats > 1 or a.top_users:
        t = time.perf_counter()
        cost = queue_cost(jobs, p, top_users=a.top_users, repeats=a.repeats)
        secs = time.perf_counter() - t
        replays = cost.repeats * (2 + len(cost.by_user))
        g, w = cost.gpu_h_freed, cost.mean_wait_freed_s
        print(
            f"over {cost.repeats} replays (submit times jittered up to 60 s; {replays} replays "
            f"in {secs:.1f} s): GPU-hours waited freed {g.mean:,.0f} ({g.low:,.0f} .. "
            f"{g.high:,.0f}{'' if g.clear else ', within the noise'}); mean wait freed "
            f"{w.mean / 60:,.1f} min ({w.low / 60:,.1f} .. {w.high / 60:,.1f})"
        )
        if cost.by_user:
            print(
                f"{'user':8}{'jobs':>7}{'padding GPU-h':>15}{'own freed':>22}{'others freed':>24}"
            )
        for u in cost.by_user:
            o, m = u.others_gpu_h_freed, u.own_gpu_h_freed
            print(
                f"{u.user:8}{u.jobs_right_sized:>7,}{u.padding_gpu_h:>15,.0f}"
                f"{m.mean:>10,.0f} ({m.low:>,.0f}..{m.high:>,.0f})"
                f"{o.mean:>10,.0f} ({o.low:>,.0f}..{o.high:>,.0f})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
