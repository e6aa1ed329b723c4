"""A bolt that reports on cue, for tests/integration/test_summary.py: on an
input [n] (under an ``all`` grouping every task gets it), its task of index
n among the component's tasks sends ``error`` "from index n" and the metric
"last" = n; every task acks every input."""

from multilang import BasicBolt


class ReportingBolt(BasicBolt):
    def initialize(self, conf, context):
        self.index = context.component_tasks(context.component_id).index(context.task_id)

    def process(self, tup):
        if tup.values[0] == self.index:
            self.report_error(f"from index {self.index}")
            self.metrics("last", self.index)


ReportingBolt().run()
