"""A BasicBolt (our Python library) that chokes on some inputs every time.

Usage: python poison_bolt.py MODE [PREFIX]

Each input whose first value, as a string, starts with PREFIX (default
"poison") is poison; every other input is emitted upper-cased (one value on
the default stream), anchored and acked by BasicBolt. On poison, by MODE:

  raise    raise ValueError (BasicBolt reports the traceback and fails the tuple)
  arity    emit two values where the stream declares one (the host's emit error)
  stream   emit on the undeclared stream "nope" (the host's emit error)
"""

import sys

from multilang import BasicBolt

MODE = sys.argv[1]
PREFIX = sys.argv[2] if len(sys.argv) > 2 else "poison"


class Poison(BasicBolt):
    def process(self, tup):
        value = str(tup.values[0])
        if not value.startswith(PREFIX):
            self.emit([value.upper()])
        elif MODE == "raise":
            raise ValueError(f"cannot digest {value!r}")
        elif MODE == "arity":
            self.emit([value, "extra"])
        elif MODE == "stream":
            self.emit([value], stream="nope")


Poison().run()
