'use strict';
// Echo bolt on our Node library (benchmark component): emit the input's values
// anchored to it, then ack it. Accepts the `batch` extension when offered.

const path = require('path');
const { Bolt } = require(path.join(__dirname, '..', '..', 'examples', 'node', 'multilang'));

class EchoBolt extends Bolt {
  process(tup) {
    this.emit(tup.values, { anchors: [tup] });
    this.ack(tup);
  }
}

new EchoBolt().run();
