"""The Faust ceiling for ``python -m benchmarks worker``: an app that only consumes the worker's
input topics and acks every message (no decoding, no processing, nothing produced), with the
worker's own consumer settings. Run as a process of its own by benchmarks/worker.py::

    python -m benchmarks.faust_passthrough BOOTSTRAP PREFIX GROUP PORT

It serves ``/metrics`` with ``gpugap_worker_messages_total``, as the worker does.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

import faust

from gpugap.streams.join import INPUTS

MAX_RECORDS = 5000  # the worker's default batch (streams.faust_runner.AppOptions)


def create(bootstrap: str, prefix: str, group: str, port: int) -> faust.App:
    app = faust.App(
        f"{prefix}{group}",
        broker=[f"kafka://{h}" for h in bootstrap.split(",")],
        store="memory://",
        datadir=os.path.join(tempfile.mkdtemp(prefix="gpugap-passthrough-"), "{conf.name}"),
        autodiscover=False,
        topic_partitions=1,
        broker_max_poll_records=MAX_RECORDS,
        broker_commit_interval=1.0,
        broker_session_timeout=10.0,
        broker_heartbeat_interval=3.0,
        consumer_auto_offset_reset="earliest",
        stream_wait_empty=False,
        web_enabled=True,
        web_bind="127.0.0.1",
        web_host="127.0.0.1",
        web_port=port,
        web_in_thread=False,
    )
    topic = app.topic(
        *sorted(t.qualified(prefix) for t in INPUTS),
        key_type=bytes,
        value_type=bytes,
        value_serializer="raw",
    )
    seen = [0]

    @app.agent(topic, concurrency=1, name="passthrough")
    async def passthrough(stream: Any) -> None:
        async for events in stream.noack_take(MAX_RECORDS, within=0.2):
            for ev in events:  # acked as the worker acks them, in offset order, per batch
                ev.ack()
            seen[0] += len(events)

    @app.page("/metrics")
    async def metrics(web: Any, request: Any) -> Any:
        return web.text(f"gpugap_worker_messages_total {seen[0]}\n", content_type="text/plain")

    return app


if __name__ == "__main__":
    bootstrap, prefix, group, port = sys.argv[1:5]
    app = create(bootstrap, prefix, group, int(port))
    sys.argv = [sys.argv[0], "worker", "-l", "warn"]
    app.main()
