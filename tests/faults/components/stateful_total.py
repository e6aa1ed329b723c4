"""A stateful bolt (§9.7, our Python library) that adds its inputs up in its
state and emits ["sum", total].

Usage: python stateful_total.py
"""

from multilang import StatefulBolt


class Total(StatefulBolt):
    def process(self, tup):
        self.state.put("sum", self.state.get("sum", 0) + tup.values[0])
        self.emit(["sum", self.state.get("sum")])


Total().run()
