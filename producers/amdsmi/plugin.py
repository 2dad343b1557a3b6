"""``gpugap produce amdsmi``: declared here, built from ``producers.REGISTRY``."""

from gpugap.groundfloor.plugin import Option, Plugin

from .settings import AmdSmiSettings

PLUGIN = Plugin(
    name="amdsmi",
    help="the node agent: every AMD GPU and compute partition of this node through amdsmi",
    extra="amdsmi",
    target="gpugap.producers.amdsmi.producer:AmdSmiProducer",
    settings=AmdSmiSettings,
    # amdsmi itself is not listed: it must come from the host's ROCm, not from an extra, and
    # its import is checked by the agent (loader.py), which says how to install it
    requires=("grpc", "google.protobuf"),
    options=(
        Option(
            "--allow-no-gpu",
            "allow_no_gpu",
            "no driver: wait for one, don't fail",
            {"action": "store_true"},
        ),
        Option(
            "--job-mapping-dir",
            "job_mapping_dir",
            "Slurm job per GPU index (dcgm-exporter's hpc-job-mapping format)",
            {"metavar": "DIR"},
        ),
        Option(
            "--pod-resources-socket",
            "pod_resources_socket",
            "kubelet PodResources socket "
            "(default /var/lib/kubelet/pod-resources/kubelet.sock, used when present)",
            {"metavar": "PATH"},
        ),
        Option(
            "--proc-root",
            "proc_root",
            "where /proc/<pid>/cgroup is read (default /proc)",
            {"metavar": "DIR"},
        ),
    ),
)
