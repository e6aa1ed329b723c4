"""A bolt that sends `metrics` commands (Storm's STORM-200), for
tests/integration/test_metrics_cli.py.

For each input it emits [the input's first value], acks it, and sends:
  "seen"  the number of tuples this process saw (a number)
  "lat"   {"p50": 1.5, "nested": {"x": 2}, "label": "text"} (a dict: numbers flattened, the string skipped)
  "note"  "a string" (not a number: only in the JSON lines)
"""

from multilang import BasicBolt


class MetricsBolt(BasicBolt):
    def initialize(self, conf, context):
        self.seen = 0

    def process(self, tup):
        self.seen += 1
        self.metrics("seen", self.seen)
        self.metrics("lat", {"p50": 1.5, "nested": {"x": 2}, "label": "text"})
        self.metrics("note", "a string")
        self.emit([tup.values[0]])


MetricsBolt().run()
