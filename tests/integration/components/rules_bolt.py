"""A bolt for host-rule tests (spec/PROTOCOL.md), written with our library.

argv[1] selects the behaviour:
  pidmode   emit [oct(mode of the pid directory), whether our pid file is in it]
  unknown   send an unknown command, then echo the input (acked)
  neverack  remember inputs, emit [value] unanchored, never ack (storm.rb's example split bolt)
"""

import os
import stat
import sys

from multilang import Bolt

MODE = sys.argv[1]


class RulesBolt(Bolt):
    def process(self, tup):
        if MODE == "pidmode":
            mode = stat.S_IMODE(os.stat(self.pid_dir).st_mode)
            ours = os.path.exists(os.path.join(self.pid_dir, str(os.getpid())))
            self.emit([oct(mode), ours])
            self.ack(tup)
        elif MODE == "unknown":
            self._out.append(b'{"command":"shrug","id":"x"}\nend\n')
            self.emit([tup.values[0], True])
            self.ack(tup)
        elif MODE == "neverack":
            self.emit([tup.values[0], False])


RulesBolt().run()
