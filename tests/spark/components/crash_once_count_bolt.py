"""A word-count bolt that SIGKILLs itself once, after N words, the first time
it runs (a marker file given as argv[1] records that it did). Used to make
Spark retry a task: the retried task must give exactly the same counts."""

import os
import signal
import sys
from collections import Counter

from multilang import BasicBolt

MARKER = sys.argv[1]
AFTER = int(sys.argv[2]) if len(sys.argv) > 2 else 50


class CrashOnceCount(BasicBolt):
    def initialize(self, conf, context):
        self.counts = Counter()
        self.seen = 0

    def process(self, tup):
        self.seen += 1
        if self.seen == AFTER and not os.path.exists(MARKER):
            with open(MARKER, "w"):
                pass
            self._flush()
            os.kill(os.getpid(), signal.SIGKILL)
        word = tup.values[0]
        self.counts[word] += 1
        self.emit([word, self.counts[word]])


CrashOnceCount().run()
