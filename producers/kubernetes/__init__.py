"""Helpers of the Kubernetes producer (``producers/kubernetes/producer.py``): GPU requests and pod
timelines (``resources``), owner chains (``owners``), the per-pod state machine
(``tracker``), what one pod may make it publish and hold, and its dead letters (``bounds``),
the list+watch thread (``watcher``) and the watch wire format (``stream``), its hand-over to
the event loop (``handoff``) and the restart ledger (``ledger``)."""
