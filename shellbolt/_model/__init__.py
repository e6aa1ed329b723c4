"""The runtime's model, pure (no trio): topologies and their loaders, groupings, the acker, the
conf schema, run results."""
