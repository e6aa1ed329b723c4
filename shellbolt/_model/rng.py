"""The host's own random numbers: tuple and edge ids, a shuffle's first
task, the tuple that stands for a batch. A ``Random`` of its own, so that a
run draws nothing from the global ``random`` that a user's in-process
component (a ``PythonBolt``) may have seeded, and leaves another thread's
draws alone (a warm Spark engine's heartbeat ids did, under Hypothesis).
Reseeded in every forked child: host workers must not repeat each other's
ids."""

from __future__ import annotations

import os
import random

__all__ = ["RNG", "getrandbits"]

RNG = random.Random()
os.register_at_fork(after_in_child=RNG.seed)
getrandbits = RNG.getrandbits
