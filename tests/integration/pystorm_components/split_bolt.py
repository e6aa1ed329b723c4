"""A pystorm bolt (unchanged pystorm API; auto-anchor and auto-ack)."""
from pystorm import Bolt


class Split(Bolt):
    def process(self, tup):
        for word in tup.values[0].split():
            self.emit([word])


Split().run()
