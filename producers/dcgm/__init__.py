"""The dcgm-exporter scraper: ``gpugap produce dcgm`` (extra ``dcgm``)."""
