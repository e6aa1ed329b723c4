"""Test spout for the Spark source: emits the tuples of a JSON file.

Usage: python source_values_spout.py TUPLES_JSON

TUPLES_JSON holds a JSON array of tuples (each a JSON array of values); the
spout emits tuple i with message id i, one per ``next``, then nothing.
"""

import json
import sys

from multilang import Spout


class ValuesSpout(Spout):
    def initialize(self, conf, context):
        with open(sys.argv[1], encoding="utf-8") as f:
            self.tuples = json.load(f)
        self.i = 0

    def next_tuple(self):
        if self.i < len(self.tuples):
            self.emit(self.tuples[self.i], msg_id=self.i)
            self.i += 1


if __name__ == "__main__":
    ValuesSpout().run()
