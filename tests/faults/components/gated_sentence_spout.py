"""The README's sentence spout (examples/python/sentence_spout.py), held at
half its input until a gate file exists: a run cannot end before a test has
killed it mid-run, however fast or slow the machine.

Usage: python gated_sentence_spout.py PATH GATE
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples" / "python"))
from sentence_spout import SentenceSpout  # noqa: E402

GATE = sys.argv.pop(2)


class GatedSentenceSpout(SentenceSpout):
    def initialize(self, conf, context):
        super().initialize(conf, context)
        self.half = len(self.queue) // 2
        self.emitted = 0

    def next_tuple(self):
        if self.emitted >= self.half and not os.path.exists(GATE):
            return
        before = len(self.queue)
        super().next_tuple()
        self.emitted += before - len(self.queue)


if __name__ == "__main__":
    GatedSentenceSpout().run()
