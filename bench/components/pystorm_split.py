"""Split-sentence bolt on pystorm: one anchored emit per word; auto_ack acks."""

from _bench_common import run

import pystorm


class Split(pystorm.Bolt):
    def process(self, tup):
        for word in tup.values[0].split():
            self.emit([word], anchors=[tup], need_task_ids=False)


if __name__ == "__main__":
    run(Split().run)
