"""A Python bolt for tests/spark/test_bolts_dataframe.py, one behaviour per
mode (argv[1]); the input value is field 0 unless said otherwise.

* ``echo``: emits [the tuple's values (a list), how many, None, "x"]: what
  the bolt was fed, and values of several JSON types.
* ``fail3``: a value "v<i>" with i divisible by 3 raises ValueError naming the
  value (BasicBolt reports it, then fails the tuple); others emit [value].
* ``crash``: the value "poison" writes "dying on poison" to stderr and exits
  with status 3 (SystemExit: the library first writes the acks of the tuples
  before it); others emit [value].
* ``log``: log() and print() and a stderr line naming the value, then emits [value].
"""

import sys

from multilang import BasicBolt

MODE = sys.argv[1]


class Rows(BasicBolt):
    def process(self, tup):
        values = tup.values
        if MODE == "echo":
            self.emit([values, len(values), None, "x"])
            return
        v = values[0]
        if MODE == "fail3" and int(v[1:]) % 3 == 0:
            raise ValueError(f"cannot take {v}")
        if MODE == "crash" and v == "poison":
            sys.stderr.write(f"dying on {v}\n")
            sys.stderr.flush()
            raise SystemExit(3)
        if MODE == "log":
            self.log(f"took {v}")
            print(f"stray print {v}")
            sys.stderr.write(f"stderr line {v}\n")
            sys.stderr.flush()
        self.emit([v])


if __name__ == "__main__":
    Rows().run()
