"""For each input [key], emit [key, the handshake conf's value for key]
(fields ["key", "value"]). Used to check that conf overrides reach components."""

from multilang import BasicBolt


class ConfBolt(BasicBolt):
    def process(self, tup):
        key = tup.values[0]
        self.emit([key, self.conf.get(key)])


if __name__ == "__main__":
    ConfBolt().run()
