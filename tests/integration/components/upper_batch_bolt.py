"""A batch-level bolt (Bolt.process_batch): upper-cases the first value of
every input, each output anchored to its input, then acks them all; inputs
whose word is "bad" are failed instead. Ticks go to process_tick, which emits
["tick"] (unanchored) and acks. Every call's size goes to stderr."""

import sys

from multilang import Bolt


class UpperBatch(Bolt):
    def process_batch(self, tuples):
        sys.stderr.write(f"batch of {len(tuples)}\n")
        good = [t for t in tuples if t.values[0] != "bad"]
        self.emit_many([[t.values[0].upper()] for t in good], anchors=good)
        self.ack_many(good)
        self.fail_many([t.id for t in tuples if t.values[0] == "bad"])

    def process_tick(self, tup):
        self.emit(["tick"])
        self.ack(tup)


UpperBatch().run()
