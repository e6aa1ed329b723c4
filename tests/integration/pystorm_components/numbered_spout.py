"""A pystorm spout (unchanged pystorm API): emits N reliable sentences and
records the ids it is told were acked or failed in the file given as argv[1]."""
import sys

from pystorm import Spout

N = 50


class Numbered(Spout):
    def initialize(self, conf, ctx):
        self.i = 0
        self.record = open(sys.argv[1], "a")

    def next_tuple(self):
        if self.i < N:
            self.emit(["a b c %d" % self.i], tup_id=self.i)
            self.i += 1

    def ack(self, tup_id):
        self.record.write("ack %r\n" % (tup_id,))
        self.record.flush()

    def fail(self, tup_id):
        self.record.write("fail %r\n" % (tup_id,))
        self.record.flush()


Numbered().run()
