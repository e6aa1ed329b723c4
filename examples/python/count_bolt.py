"""Word-count bolt: ["word"] -> ["word", count], the running count.

The counts live in this process's memory: if the process is killed they are
lost, exactly as with a Storm bolt (see the README on exact counts).
"""

from collections import Counter

from multilang import BasicBolt


class CountBolt(BasicBolt):
    def initialize(self, conf, context):
        self.counts = Counter()

    def process(self, tup):
        word = tup.values[0]
        self.counts[word] += 1
        self.emit([word, self.counts[word]])


if __name__ == "__main__":
    CountBolt().run()
