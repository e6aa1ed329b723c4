"""Echo bolt on pystorm, written as a typical pystorm user would.

pystorm's defaults do the ack (``auto_ack``); the emit is anchored to the
input and says ``need_task_ids: false``, so the protocol work equals ours.
"""

from _bench_common import run

import pystorm


class Echo(pystorm.Bolt):
    def process(self, tup):
        self.emit(tup.values, anchors=[tup], need_task_ids=False)


if __name__ == "__main__":
    run(Echo().run)
