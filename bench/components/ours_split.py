"""Split-sentence bolt on our library: one anchored emit per word, then ack."""

from _bench_common import run

from multilang import Bolt


class Split(Bolt):
    def process(self, tup):
        for word in tup.values[0].split():
            self.emit([word], anchors=[tup])
        self.ack(tup)


if __name__ == "__main__":
    run(Split().run)
