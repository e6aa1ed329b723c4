"""Test spout for the Spark source: emits N sentences and records what it sees.

Usage: python ack_spout.py EVENTS_FILE N [--crash-after K MARKER] [--bad-first]

* Message ids alternate JSON types: even i -> the integer i, odd i -> the
  string "m-<i>" (the source must hand them back with their type).
* Every emit, ack and fail is appended to EVENTS_FILE as one JSON line
  ``{"ev": "emit"|"ack"|"fail", "id": <id>, "pid": <pid>}``, flushed at once.
* ``--crash-after K MARKER``: if MARKER does not exist, create it and exit(3)
  on the ``next`` after K emits (once per MARKER: the restarted process runs
  normally and, being non-durable, starts again from sentence 0).
* ``--bad-first``: first emit ["bad", "arity"] (two values, id "bad"); when it
  is failed, re-emit ["fixed"] with the same id.
"""

import json
import os
import sys

from multilang import Spout


class AckSpout(Spout):
    def initialize(self, conf, context):
        args = sys.argv[1:]
        self.events = open(args[0], "a", encoding="utf-8")
        self.n = int(args[1])
        self.crash_after = None
        if "--crash-after" in args:
            i = args.index("--crash-after")
            self.crash_after, self.marker = int(args[i + 1]), args[i + 2]
        self.bad = "--bad-first" in args
        self.i = 0
        self.emitted = 0
        self.retry = []

    def record(self, ev, msg_id):
        self.events.write(json.dumps({"ev": ev, "id": msg_id, "pid": os.getpid()}) + "\n")
        self.events.flush()

    def next_tuple(self):
        if self.crash_after is not None and self.emitted >= self.crash_after and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os._exit(3)
        if self.bad:
            self.bad = False
            self.record("emit", "bad")
            self.emit(["bad", "arity"], msg_id="bad")
            return
        if self.retry:
            self.record("emit", "bad")
            self.emit([self.retry.pop()], msg_id="bad")
            return
        if self.i < self.n:
            i = self.i
            self.i += 1
            msg_id = i if i % 2 == 0 else f"m-{i}"
            self.record("emit", msg_id)
            self.emit([f"s-{i}"], msg_id=msg_id)
            self.emitted += 1

    def ack(self, msg_id):
        self.record("ack", msg_id)

    def fail(self, msg_id):
        self.record("fail", msg_id)
        if msg_id == "bad":
            self.retry.append("fixed")


if __name__ == "__main__":
    AckSpout().run()
