"""``gpugap produce nvml``: declared here, built from ``producers.REGISTRY``."""

from gpugap.groundfloor.plugin import Option, Plugin

from .settings import NvmlSettings

PLUGIN = Plugin(
    name="nvml",
    help="the node agent: every GPU and MIG instance of this node through NVML",
    extra="nvml",
    target="gpugap.producers.nvml.producer:NvmlProducer",
    settings=NvmlSettings,
    requires=("pynvml", "grpc", "google.protobuf"),
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
    ),
)
