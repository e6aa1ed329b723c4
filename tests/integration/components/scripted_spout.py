"""A scripted spout for the runtime tests (Python component library).

Usage: python scripted_spout.py SCRIPT_JSON

SCRIPT_JSON is an object:
  items   list of {"values": [...], "id": <any JSON, absent = unreliable>,
          "replay": [...] (values to re-emit on fail, default the same),
          "after": secs (sleep this long before emitting it), "stream": str}
  replay  bool (default true): re-emit failed items on a later next_tuple
  need_task_ids  bool (default false): ask the host for task ids per emit
  events  bool (default true): report on the "events" stream (below)

Each next_tuple emits at most one item: queued replays first, then the next
item. Everything the spout learns is reported as an unreliable emit on stream
"events" with fields ["event", "msg_id", "outstanding"]:
  ["emitted", id, n]  after each reliable emit (n = reliable emits not yet
                      acked or failed, as this spout sees them)
  ["acked", id, n] / ["failed", id, n]  in the ack / fail callbacks
  ["task_ids", ids, n] when need_task_ids is on
"""

import json
import sys
import time
from collections import deque

from multilang import Spout


class ScriptedSpout(Spout):
    def initialize(self, conf, context):
        script = json.loads(sys.argv[1])
        self.items = deque(script.get("items", []))
        self.replay_on = script.get("replay", True)
        self.need_ids = script.get("need_task_ids", False)
        self.events_on = script.get("events", True)
        self.by_id = {}
        self.n_out = 0
        self.replays = deque()

    def event(self, kind, msg_id):
        if self.events_on:
            self.emit([kind, msg_id, self.n_out], stream="events")

    def send(self, item, values):
        msg_id = item.get("id")
        ids = self.emit(values, stream=item.get("stream"), msg_id=msg_id, need_task_ids=self.need_ids)
        if msg_id is not None:
            self.n_out += 1
            self.event("emitted", msg_id)
        if self.need_ids and self.events_on:
            self.emit(["task_ids", ids, self.n_out], stream="events")

    def next_tuple(self):
        if self.replays:
            item = self.replays.popleft()
            self.send(item, item.get("replay", item["values"]))
            return
        if self.items:
            item = self.items.popleft()
            if item.get("after"):
                time.sleep(item["after"])
            if item.get("id") is not None:
                self.by_id[json.dumps(item["id"], sort_keys=True)] = item
            self.send(item, item["values"])

    def ack(self, msg_id):
        self.n_out -= 1
        self.event("acked", msg_id)

    def fail(self, msg_id):
        self.n_out -= 1
        self.event("failed", msg_id)
        item = self.by_id.get(json.dumps(msg_id, sort_keys=True))
        if self.replay_on and item is not None:
            self.replays.append(item)


if __name__ == "__main__":
    ScriptedSpout().run()
