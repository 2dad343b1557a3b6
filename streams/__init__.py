"""Stream processing: the event-time join, windowing and alerts (pure core + Faust agents)."""
