"""``--record`` (a run's frames, per task) and ``multilang replay``."""
