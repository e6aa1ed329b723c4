"""A batching bolt, Storm's common pattern (our Python library): it holds its
inputs until it has three, then emits their sum anchored to all three and
acks them. Its trees wait for more input while they are held.

Usage: python batching_bolt.py
"""

from multilang import Bolt


class Batching(Bolt):
    def initialize(self, conf, context):
        self.held = []

    def process(self, tup):
        self.held.append(tup)
        if len(self.held) == 3:
            self.emit([sum(t.values[0] for t in self.held)], anchors=self.held)
            for t in self.held:
                self.ack(t)
            self.held = []


Batching().run()
