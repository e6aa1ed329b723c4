"""A stateful bolt (the library's StatefulBolt, spec/PROTOCOL.md §9.7) that
misbehaves on request, for tests/faults/test_stateful_edges.py.

Usage: python stateful_bolt.py [--mode count|unique|letters] [--fail-dir DIR --fail-mod F]
                               [--hang-prepare MARKER] [--slow-prepare MARKER --slow-secs S]
                               [--prepare-secs S] [--ticks]

Modes:
  count    input [n] (a number, or its decimal string): key = WORDS[n % len(WORDS)];
           state[key] += 1; emits [key, count, first letter of key]
  unique   as count, with key = "n<n>": each key is set once (to 1) if every
           spout tuple is counted once
  letters  input [word, count, letter]: key = letter;
           state[key] += count; emits [key, sum]

``--fail-dir DIR --fail-mod F``: the first time a value n with n % F == 0
is seen (by any process: a marker file DIR/fail-n), the bolt changes its
state for it as usual and then *fails* the tuple (put, then fail: the
rollback has to undo the put).

``--hang-prepare MARKER``: the first process that gets a ``prepare`` (the
marker file is created first) never answers it: it sleeps until killed.

``--slow-prepare MARKER --slow-secs S``: the first process that gets a
``prepare`` writes MARKER, sleeps S seconds, then answers.

``--prepare-secs S``: every ``prepare`` takes S seconds to answer (a big
state to write out, say).

``--ticks``: each tick tuple also changes the state (key "ticks" += 1;
ticks belong to no tree: at most once, never compared exactly).

Every process writes ``stateful_bolt pid P ready with K keys`` to stderr at init.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from multilang import StatefulBolt

WORDS = ["alice", "anna", "bob", "bill", "carol", "cat", "dave", "dog", "eve", "emma", "frank", "gus", "hatter"]

p = argparse.ArgumentParser()
p.add_argument("--mode", default="count", choices=["count", "letters", "unique"])
p.add_argument("--fail-dir")
p.add_argument("--fail-mod", type=int, default=0)
p.add_argument("--hang-prepare")
p.add_argument("--slow-prepare")
p.add_argument("--slow-secs", type=float, default=0.0)
p.add_argument("--prepare-secs", type=float, default=0.0)
p.add_argument("--ticks", action="store_true")
ARGS = p.parse_args()


def fire(marker: str | None) -> bool:
    """True the first time, in any process (the marker file is created first)."""
    if not marker:
        return False
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


class EdgeBolt(StatefulBolt):
    def init_state(self, state):
        sys.stderr.write(f"stateful_bolt pid {os.getpid()} ready with {len(state)} keys\n")
        sys.stderr.flush()

    def process(self, tup):
        if ARGS.mode in ("count", "unique"):
            n = int(tup.values[0])
            key = WORDS[n % len(WORDS)] if ARGS.mode == "count" else f"n{n}"
            value = self.state.get(key, 0) + 1
        else:
            _word, count, key = tup.values
            n = None
            value = self.state.get(key, 0) + int(count)
        self.state.put(key, value)
        if n is not None and ARGS.fail_dir and ARGS.fail_mod and n % ARGS.fail_mod == 0 \
                and fire(os.path.join(ARGS.fail_dir, f"fail-{n}")):
            self.fail(tup)  # after the put: only the rollback can undo it
            return
        self.emit([key, value, key[0]] if n is not None else [key, value])

    def process_tick(self, tup):
        if ARGS.ticks:
            self.state.put("ticks", self.state.get("ticks", 0) + 1)

    def pre_prepare(self, txid):
        if fire(ARGS.hang_prepare):
            sys.stderr.write(f"stateful_bolt pid {os.getpid()}: never answering prepare {txid}\n")
            sys.stderr.flush()
            time.sleep(600)
        if ARGS.slow_prepare and fire(ARGS.slow_prepare):
            time.sleep(ARGS.slow_secs)
        if ARGS.prepare_secs:
            time.sleep(ARGS.prepare_secs)


if __name__ == "__main__":
    EdgeBolt().run()
