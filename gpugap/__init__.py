"""gpugap: allocated vs consumed GPU-hours across Slurm and Kubernetes."""

from gpugap.groundfloor import __version__

__all__ = ["__version__"]
