"""A bolt (our Python library) that acks late: it emits each input at once,
anchored, and acks everything it holds only on each tick tuple, like a
bulk-insert sink that commits on a timer. Never acks the ticks themselves.

Usage: python tick_ack_bolt.py [--never]   (--never: never ack anything)
"""

import sys

from multilang import Bolt

NEVER = "--never" in sys.argv


class TickAck(Bolt):
    def initialize(self, conf, context):
        self.held = []

    def process(self, tup):
        self.emit([tup.values[0]], anchors=[tup])
        self.held.append(tup)

    def process_tick(self, tup):
        if not NEVER:
            for t in self.held:
                self.ack(t)
            self.held = []


TickAck().run()
