"""Echo bolt on our library: emit the input's values anchored to it, then ack."""

from _bench_common import run

from multilang import Bolt


class Echo(Bolt):
    def process(self, tup):
        self.emit(tup.values, anchors=[tup])
        self.ack(tup)


if __name__ == "__main__":
    run(Echo().run)
