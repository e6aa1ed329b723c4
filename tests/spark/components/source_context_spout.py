"""Test spout for the Spark source: reports the handshake context it got.

Usage: python source_context_spout.py

Emits one tuple per process, on its first ``next``, with message id "ctx"::

    [taskid, componentid, component's task ids, task->component, consumer ids]

The last value is what a ``need_task_ids`` emit was answered (an unreliable
probe emit on the same stream, made first, gets it: its values are the same
shape, with "probe" as the componentid). Nothing after that.
"""

from multilang import Spout


class ContextSpout(Spout):
    def initialize(self, conf, context):
        self.done = False

    def next_tuple(self):
        if self.done:
            return
        self.done = True
        ctx = self.context
        mapping = {str(t): c for t, c in sorted(ctx.task_to_component.items())}
        tasks = ctx.component_tasks(ctx.component_id)
        consumers = self.emit([0, "probe", [], {}, []], need_task_ids=True)
        self.emit([ctx.task_id, ctx.component_id, tasks, mapping, consumers], msg_id="ctx")


if __name__ == "__main__":
    ContextSpout().run()
