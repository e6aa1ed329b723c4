"""Echo bolt on our library's batch-level API: ``process_batch`` gets the
tuples that arrived together; the columns (``ids``, ``values``) go to
``emit_many`` (each output anchored to its input) and ``ack_many``."""

from _bench_common import run

from multilang import Bolt


class Echo(Bolt):
    def process_batch(self, tuples):
        self.emit_many(tuples.values, anchors=tuples.ids)
        self.ack_many(tuples.ids)


if __name__ == "__main__":
    run(Echo().run)
