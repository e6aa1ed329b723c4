"""The scripted conformance component for the Python library.

Usage: python conformance_component.py [bolt|basic|spout|stateful]

Its behaviour is specified in spec/CONFORMANCE.md: each action is keyed on
the first value of the input tuple, so `multilang conform` can drive every
part of the library's API and check the frames it produces.
"""

import os
import sys

from multilang import BasicBolt, Bolt, Spout, StatefulBolt

MODE = sys.argv[1] if len(sys.argv) > 1 else "bolt"
SPOUT_IDS = [0, "1", -2, "-3", 4.5, {"k": [5]}, None]


def announce(component):
    component.log(f"multilang-conformance ready mode={MODE} lang=python")


class ScriptedBolt(Bolt):
    def initialize(self, conf, context):
        self.held = []
        announce(self)

    def process(self, tup):
        action = tup.values[0] if tup.values else None
        v = tup.values
        if action == "ack":
            self.ack(tup)
        elif action == "fail":
            self.fail(tup)
        elif action == "echo":
            self.emit(v, anchors=[tup])
            self.ack(tup)
        elif action == "emit":
            ids = self.emit(v[1], stream=v[2], anchors=[tup], need_task_ids=True)
            self.emit(["task_ids", ids], anchors=[tup])
            self.ack(tup)
        elif action == "emit_unanchored":
            self.emit(v[1])
            self.ack(tup)
        elif action == "emit_direct":
            self.emit_direct(v[1], v[2], anchors=[tup])
            self.ack(tup)
        elif action == "emit_many":
            for i in range(v[1]):
                self.emit(["n", i], anchors=[tup])
            self.ack(tup)
        elif action == "hold":
            self.held.append(tup)
        elif action == "release":
            self.emit(v[1], anchors=self.held + [tup])
            for held in self.held:
                self.ack(held)
            self.held = []
            self.ack(tup)
        elif action == "log":
            self.log(v[1], v[2])
            self.ack(tup)
        elif action == "error":
            self.report_error(v[1])
            self.ack(tup)
        elif action == "metrics":
            self.metrics(v[1], v[2])
            self.ack(tup)
        elif action == "print":
            print(v[1])
            self.ack(tup)
        elif action == "exit":
            self._flush()
            os._exit(v[1])
        else:
            self.report_error(f"unknown action: {action}")
            self.fail(tup)

    def process_tick(self, tup):
        self.emit(["tick", tup.values[0] if tup.values else None], anchors=[tup])
        self.ack(tup)


class ScriptedBasicBolt(BasicBolt):
    def initialize(self, conf, context):
        announce(self)

    def process(self, tup):
        action = tup.values[0] if tup.values else None
        if action == "echo":
            self.emit(tup.values)
        elif action == "raise":
            raise RuntimeError(tup.values[1])

    def process_tick(self, tup):
        self.emit(["tick", tup.values[0] if tup.values else None])


class ScriptedStatefulBolt(StatefulBolt):
    """Mode stateful: each tuple is an operation on the state (§9.7)."""

    def initialize(self, conf, context):
        announce(self)

    def process(self, tup):
        op = tup.values[0] if tup.values else None
        v = tup.values
        if op == "put":
            self.state.put(v[1], v[2])
        elif op == "delete":
            self.state.delete(v[1])
        elif op == "get":
            self.emit([v[1], self.state.get(v[1])])
        else:
            self.fail(tup)


class ScriptedSpout(Spout):
    def initialize(self, conf, context):
        self.k = 0
        announce(self)
        self.emit(["open"], msg_id="open")

    def activate(self):
        self.emit(["activated"])

    def deactivate(self):
        self.emit(["deactivated"])

    def next_tuple(self):
        if self.k < len(SPOUT_IDS):
            ids = self.emit(["next", self.k], msg_id=SPOUT_IDS[self.k], need_task_ids=True)
            self.emit(["task_ids", ids])
            self.k += 1

    def ack(self, msg_id):
        self.emit(["acked", msg_id])

    def fail(self, msg_id):
        self.emit(["failed", msg_id])


if __name__ == "__main__":
    {"bolt": ScriptedBolt, "basic": ScriptedBasicBolt, "spout": ScriptedSpout,
     "stateful": ScriptedStatefulBolt}[MODE]().run()
