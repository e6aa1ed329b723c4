"""A bolt for the runtime tests that says which task got what.

Usage: python tag_bolt.py [--sleep S] [--fail-on TOKEN] [--hold-on TOKEN]
                          [--slow-on TOKEN:SECS]

For each input it emits [its task id, the input values] (fields
["task", "values"]) anchored to the input, then acks it (an explicit Bolt).
A TOKEN is compared with the input's first value:
  --fail-on   emit, then fail the input instead of acking it
  --hold-on   emit, never ack it
  --slow-on   emit, sleep SECS, then ack
  --sleep     sleep S seconds before handling every input
Ticks get ["tick", task id] and are acked.
"""

import argparse
import sys
import time

from multilang import Bolt

p = argparse.ArgumentParser()
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--fail-on")
p.add_argument("--hold-on")
p.add_argument("--slow-on")
ARGS = p.parse_args(sys.argv[1:])


class TagBolt(Bolt):
    def initialize(self, conf, context):
        self.task = context.task_id
        self.held = []
        self.slow_token, self.slow_secs = None, 0.0
        if ARGS.slow_on:
            token, _, secs = ARGS.slow_on.rpartition(":")
            self.slow_token, self.slow_secs = token, float(secs)

    def process(self, tup):
        if ARGS.sleep:
            time.sleep(ARGS.sleep)
        first = tup.values[0] if tup.values else None
        self.emit([self.task, tup.values], anchors=[tup])
        if ARGS.fail_on is not None and first == ARGS.fail_on:
            self.fail(tup)
        elif ARGS.hold_on is not None and first == ARGS.hold_on:
            self.held.append(tup)
        elif self.slow_token is not None and first == self.slow_token:
            self._flush()  # the emit goes out now; the ack comes late
            time.sleep(self.slow_secs)
            self.ack(tup)
        else:
            self.ack(tup)

    def process_tick(self, tup):
        self.emit(["tick", self.task], anchors=[tup])
        self.ack(tup)


if __name__ == "__main__":
    TagBolt().run()
