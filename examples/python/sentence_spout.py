"""Sentence spout: emits each non-empty line of a text file as ["sentence"].

Usage: python sentence_spout.py PATH   (PATH relative to the working directory)

Message id = the 0-based line number (an int), so every emit is reliable. A
failed (or timed-out) sentence is queued again and re-emitted on a later
``next``; an acked one is forgotten. When every line has been emitted and
acked, ``next`` emits nothing.
"""

import sys
from collections import deque

from multilang import Spout


class SentenceSpout(Spout):
    def initialize(self, conf, context):
        path = sys.argv[1] if len(sys.argv) > 1 else conf.get("sentences.path", "sentences.txt")
        with open(path, encoding="utf-8", newline="") as f:
            # Split on \n and strip ASCII whitespace only, exactly as the
            # Ruby and Node sentence spouts do.
            self.lines = [line.strip(" \t\n\r\f\v") for line in f.read().split("\n")]
        self.queue = deque(i for i, line in enumerate(self.lines) if line)
        self.pending = set()

    def next_tuple(self):
        if self.queue:
            i = self.queue.popleft()
            self.pending.add(i)
            self.emit([self.lines[i]], msg_id=i)

    def ack(self, msg_id):
        self.pending.discard(msg_id)

    def fail(self, msg_id):
        if msg_id in self.pending:
            self.pending.discard(msg_id)
            self.queue.append(msg_id)


if __name__ == "__main__":
    SentenceSpout().run()
