'use strict';
// Word-count topology: count bolt. Keeps counts[word] (a Map) and emits
// [word, count] for each input word. Ticks are only acked.
// Usage: node examples/node/count_bolt.js

const { BasicBolt } = require(require('path').join(__dirname, 'multilang'));

class CountBolt extends BasicBolt {
  initialize() {
    this.counts = new Map();
  }

  process(tup) {
    const word = tup.values[0];
    const count = (this.counts.get(word) || 0) + 1;
    this.counts.set(word, count);
    this.emit([word, count]);
  }
}

if (require.main === module) new CountBolt().run();

module.exports = { CountBolt };
