'use strict';
// The README's Node count bolt (a StatefulBolt) that SIGKILLs itself once,
// after N words, the first time it runs anywhere (a marker file, argv[2],
// records that it did). Usage: node engine_crash_once_count_bolt.js MARKER N
const fs = require('fs');
const path = require('path');
const { CountBolt } = require(path.join(__dirname, '..', '..', '..', 'examples', 'node', 'count_bolt.js'));

const MARKER = process.argv[2];
const AFTER = parseInt(process.argv[3] || '50', 10);

class CrashOnceCount extends CountBolt {
  process(tup) {
    this.seen = (this.seen || 0) + 1;
    if (this.seen === AFTER && !fs.existsSync(MARKER)) {
      fs.writeFileSync(MARKER, String(process.pid));
      process.kill(process.pid, 'SIGKILL');
    }
    super.process(tup);
  }
}

new CrashOnceCount().run();
