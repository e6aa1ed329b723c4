"""A pystorm bolt with a bug: it acks every tuple twice."""

from pystorm import Bolt


class DoubleAck(Bolt):
    auto_ack = False

    def process(self, tup):
        self.emit([str(tup.values[0])], anchors=[tup])
        self.ack(tup)
        self.ack(tup)


DoubleAck().run()
