'use strict';
// Word-count topology: split bolt. Splits field 0 (a sentence) into words:
// ASCII-whitespace tokens, ASCII punctuation stripped from both ends, A-Z
// lowercased; emits [word] per non-empty word. Ticks are only acked.
// Usage: node examples/node/split_bolt.js

const { BasicBolt } = require(require('path').join(__dirname, 'multilang'));

const PUNCT = new Set('!"#$%&\'()*+,-./:;<=>?@[\\]^_`{|}~');

function stripPunct(token) {
  let a = 0;
  let b = token.length;
  while (a < b && PUNCT.has(token[a])) a++;
  while (b > a && PUNCT.has(token[b - 1])) b--;
  return token.slice(a, b);
}

function words(sentence) {
  const result = [];
  for (const token of String(sentence).split(/[ \t\n\r\f\v]+/)) {
    const word = stripPunct(token).replace(/[A-Z]+/g, (s) => s.toLowerCase());
    if (word !== '') result.push(word);
  }
  return result;
}

class SplitBolt extends BasicBolt {
  process(tup) {
    for (const word of words(tup.values[0])) this.emit([word]);
  }
}

if (require.main === module) new SplitBolt().run();

module.exports = { SplitBolt, words };
