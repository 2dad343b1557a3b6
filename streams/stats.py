"""What a worker reports on /metrics and /healthz."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class WorkerStats:
    started: float = field(default_factory=time.monotonic)
    messages: int = 0
    processed: int = 0  # records handed to the core (in event-time order)
    gpu_samples: int = 0
    counts: Counter[str] = field(default_factory=Counter)  # outputs by topic
    last_poll: float = field(default_factory=time.monotonic)
    buffered: int = 0
    open_minutes: int = 0
    nodes: int = 0  # nodes held (the node cap counts them), as of the last snapshot
    gpus: int = 0  # GPUs held (the GPU cap counts them), likewise
    allocations: int = 0  # allocations held (the allocation cap counts them), likewise
    core: dict[str, int] = field(default_factory=dict)
    snapshot_s: float = 0.0  # how long building the last snapshot took
    #: how long the last checkpoint took, start to end: the outputs flushed, the snapshot
    #: built, written and acknowledged (the worker takes no record meanwhile)
    checkpoint_s: float = 0.0
    #: batches or ticks that failed outside a record: the state was dropped and restored
    restores_after_failure: int = 0
    #: /healthz answers 503 once the worker has not polled for this long
    stale_after_s: float = 60.0

    def stale(self) -> bool:
        return time.monotonic() - self.last_poll > self.stale_after_s

    def prometheus(self, dead: Counter[str], lag: dict[str, int] | None = None) -> str:
        up = time.monotonic() - self.started
        lines = [
            f"gpugap_worker_uptime_seconds {up:.1f}",
            f"gpugap_worker_messages_total {self.messages}",
            f"gpugap_worker_processed_total {self.processed}",
            f"gpugap_worker_gpu_samples_total {self.gpu_samples}",
            f"gpugap_worker_buffered_records {self.buffered}",
            f"gpugap_worker_open_minutes {self.open_minutes}",
            f"gpugap_worker_nodes {self.nodes}",
            f"gpugap_worker_gpus {self.gpus}",
            f"gpugap_worker_allocations {self.allocations}",
            f"gpugap_worker_seconds_since_poll {time.monotonic() - self.last_poll:.1f}",
            f"gpugap_worker_restores_after_failure_total {self.restores_after_failure}",
            f"gpugap_worker_checkpoint_seconds {self.checkpoint_s:.3f}",
        ]
        lines += [f'gpugap_worker_output_total{{topic="{k}"}} {v}' for k, v in self.counts.items()]
        lines += [f'gpugap_worker_core_total{{what="{k}"}} {v}' for k, v in self.core.items()]
        lines += [f'gpugap_worker_dead_letters_total{{kind="{k}"}} {v}' for k, v in dead.items()]
        lines += [f'gpugap_worker_lag{{partition="{k}"}} {v}' for k, v in (lag or {}).items()]
        return "\n".join(lines) + "\n"
