"""The Intel XPU Manager exporter scraper: ``gpugap produce xpum`` (extra ``xpum``)."""
