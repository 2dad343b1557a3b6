"""gpugap: allocated vs consumed GPU-hours across Slurm and Kubernetes."""

__version__ = "0.1.0"
