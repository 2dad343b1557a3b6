"""Helpers of the Kubernetes producer (``producers/kubernetes.py``): GPU requests and pod
timelines (``resources``), owner chains (``owners``), the per-pod state machine
(``tracker``), the list+watch thread (``watcher``), its hand-over to the event loop
(``handoff``) and the restart ledger (``ledger``)."""
