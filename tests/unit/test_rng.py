"""The host draws its ids from a Random of its own (shellbolt/_model/rng.py):
a run leaves the global ``random`` as a user seeded it, and a forked child
(a host worker) draws other ids than its parent."""

from __future__ import annotations

import os
import random

import trio

from multilang.shellbolt import PythonBolt, PythonSpout, Runtime, TopologyBuilder
from multilang.shellbolt._model.rng import getrandbits


def test_a_run_leaves_the_global_random_as_the_user_seeded_it():
    random.seed(42)
    expected = [random.random() for _ in range(3)]
    random.seed(42)
    b = TopologyBuilder()
    b.set_spout("s", PythonSpout([[i] for i in range(200)], fields=["n"]))
    b.set_bolt("b", PythonBolt(lambda v: [[v[0] * 2]], fields=["n"]), parallelism=2).shuffle_grouping("s")
    result = trio.run(lambda: Runtime(b.create_topology({}, name="rng")).run(until_done=True))
    assert result.completed == 200
    assert [random.random() for _ in range(3)] == expected


def test_a_forked_child_draws_other_ids_than_its_parent():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first id, to the parent
        os.write(write, str(getrandbits(64)).encode())
        os._exit(0)
    os.close(write)
    child = int(os.read(read, 64))
    os.waitpid(pid, 0)
    os.close(read)
    assert child != getrandbits(64)
