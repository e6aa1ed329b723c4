"""A topology as a Structured Streaming query: the driver, the per-bolt stages, the state."""
