"""The NVML node agent: ``gpugap produce nvml`` (extra ``nvml``)."""
