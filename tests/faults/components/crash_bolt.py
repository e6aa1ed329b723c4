"""A plain Bolt (our Python library) that dies on poison: an exception that
escapes a plain Bolt ends the process, in all three libraries.

Usage: python crash_bolt.py [forget]

Every other input is emitted upper-cased (anchored) and acked. With
``forget``, the poison input is instead emitted and never acked or failed
(its tree can only time out).
"""

import sys

from multilang import Bolt

FORGET = "forget" in sys.argv[1:]


class Crash(Bolt):
    def process(self, tup):
        value = tup.values[0]
        if value == "poison":
            if FORGET:
                self.emit([value.upper()], anchors=[tup])
                return
            raise ValueError("poison kills this process")
        self.emit([value.upper()], anchors=[tup])
        self.ack(tup)


Crash().run()
