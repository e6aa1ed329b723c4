"""What every Spark entry point runs in a partition: the spec, the warm engine and its pool, the
lease that carries the exactly-once promise, the counters."""
