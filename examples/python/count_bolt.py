"""Word-count bolt: ["word"] -> ["word", count], the running count.

A StatefulBolt: the counts are its key-value state (spec/PROTOCOL.md §9.7).
Under a host that offers extension `state` (ours does, §9.4) the host
checkpoints them: a restarted process starts from the last committed counts,
and after a failure the counts go back to the last commit while the tuples
since are replayed, so each word is counted once. Under a host that offers
nothing (Storm's) the counts live in this process's memory, starting empty,
and are lost with it, exactly as with a Storm bolt (see the README on exact
counts).
"""

from multilang import StatefulBolt


class CountBolt(StatefulBolt):
    def process(self, tup):
        word = tup.values[0]
        count = self.state.get(word, 0) + 1
        self.state.put(word, count)
        self.emit([word, count])


if __name__ == "__main__":
    CountBolt().run()
