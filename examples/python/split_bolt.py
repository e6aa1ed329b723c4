"""Split-sentence bolt: ["sentence"] -> one ["word"] per word.

Words: split on ASCII whitespace; strip ASCII punctuation from both ends of
each token; lowercase A-Z only; drop empty tokens. The Ruby and Node split
bolts do exactly the same, so any mix of languages counts the same words.
"""

import re
import string

from multilang import BasicBolt

# str.split() would also split on Unicode spaces; the other languages' bolts
# split on ASCII whitespace only.
_WS = re.compile(r"[ \t\n\r\f\v]+")
_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def words(sentence):
    for token in _WS.split(sentence):
        word = token.strip(string.punctuation).translate(_LOWER)
        if word:
            yield word


class SplitBolt(BasicBolt):
    def process(self, tup):
        for word in words(tup.values[0]):
            self.emit([word])


if __name__ == "__main__":
    SplitBolt().run()
