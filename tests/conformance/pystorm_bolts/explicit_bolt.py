"""A plain pystorm bolt as people write them: auto_ack off, anchored emits, an
explicit ack (unchanged pystorm API)."""

from pystorm import Bolt


class Explicit(Bolt):
    auto_ack = False
    auto_anchor = False

    def process(self, tup):
        for word in str(tup.values[0]).split():
            self.emit([word], anchors=[tup])
        self.ack(tup)


Explicit().run()
