"""Cost on top of capacity: rate cards per cluster (``card``), applied by the warehouse views
of migration 008 beside the GPU-hours, never mixed into them; the report's cost section
(``report``) and ``gpugap cost`` (``cli``). See docs/cost.md.

Nothing is imported here: the sink imports ``groundfloor.ratecard`` alone (no report code)."""
