"""The runtime on trio: routing and stopping (``runtime``), tasks and their drivers, sinks,
checkpoints and the state store."""
