'use strict';
// Word-count topology: count bolt (a StatefulBolt). For each input word,
// count = state[word] + 1 is stored back and [word, count] is emitted,
// anchored to the input. Ticks are only acked. The counts live in the bolt's
// key-value state: kept durable by multilang-bridge's host when it offers the
// `state` extension (spec §9.7), in memory (lost with the process) under
// Storm's host.
// Usage: node examples/node/count_bolt.js

const { StatefulBolt } = require(require('path').join(__dirname, 'multilang'));

class CountBolt extends StatefulBolt {
  process(tup) {
    const word = tup.values[0];
    const count = this.state.get(word, 0) + 1;
    this.state.put(word, count);
    this.emit([word, count]);
  }
}

if (require.main === module) new CountBolt().run();

module.exports = { CountBolt };
