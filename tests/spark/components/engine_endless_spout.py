"""An unbounded spout, like storm-starter's randomsentence: emits one of five
sentences forever, sentence i = SENTENCES[i % 5] with message id i (so a
run's first N tuples are known), and logs acks and fails to stderr."""

import sys
import time

from multilang import Spout

SENTENCES = ["the cow jumped over the moon", "an apple a day keeps the doctor away",
             "four score and seven years ago", "snow white and the seven dwarfs", "i am at two with nature"]
DELAY = float(sys.argv[1]) if len(sys.argv) > 1 else 0.002


class Endless(Spout):
    def initialize(self, conf, context):
        self.i = 0

    def next_tuple(self):
        time.sleep(DELAY)
        self.emit([SENTENCES[self.i % 5]], msg_id=self.i)
        self.i += 1


Endless().run()
