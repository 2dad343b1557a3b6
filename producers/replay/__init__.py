"""Recorded topics: ``gpugap record`` writes JSON lines, ``gpugap replay`` publishes them again."""
