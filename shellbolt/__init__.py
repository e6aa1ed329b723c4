"""The host runtime (trio): supervised ShellBolt/ShellSpout processes,
topologies, the acker. Imported as ``multilang.shellbolt``."""
