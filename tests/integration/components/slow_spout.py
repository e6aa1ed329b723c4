"""A spout whose `next`s bring nothing for a while before each of its inputs
come, as one still connecting to its source does, then pausing between them.

Usage: slow_spout.py QUIET N [PAUSE]   QUIET seconds of nothing from its
activation, then N inputs ["item0"] ... (message ids 0 ...), emitted in two
halves with PAUSE seconds of nothing between them (default 0)."""

import sys
import time

from multilang import Spout


class SlowSpout(Spout):
    def initialize(self, conf, context):
        self.quiet, self.n = float(sys.argv[1]), int(sys.argv[2])
        self.pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
        self.started = None
        self.i = 0
        self.half_at = None

    def activate(self):
        self.started = time.monotonic()

    def next_tuple(self):
        now = time.monotonic()
        if self.started is None:  # (a host that sent no activate)
            self.started = now
        if now - self.started < self.quiet or self.i >= self.n:
            return
        if self.i == self.n // 2:
            self.half_at = self.half_at or now
            if now - self.half_at < self.pause:
                return
        self.emit([f"item{self.i}"], msg_id=self.i)
        self.i += 1


if __name__ == "__main__":
    SlowSpout().run()
