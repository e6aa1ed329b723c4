'use strict';
// Scripted conformance component (see spec/CONFORMANCE.md): actions are keyed
// on the values of the tuples it receives.
// Usage: node examples/node/conformance_component.js [bolt|basic|spout|stateful]

const { Bolt, BasicBolt, StatefulBolt, Spout } = require(require('path').join(__dirname, 'multilang'));

const MODE = process.argv[2] || 'bolt';
const READY = `multilang-conformance ready mode=${MODE} lang=node`;
const NF = { needTaskIds: false };

function show(v) {
  return typeof v === 'string' ? v : JSON.stringify(v === undefined ? null : v);
}

class ConformanceBolt extends Bolt {
  initialize() {
    this.held = [];
    this.log(READY);
  }

  async process(tup) {
    const [action, ...args] = tup.values;
    const anchors = [tup];
    switch (action) {
      case 'ack':
        break;
      case 'fail':
        this.fail(tup);
        return;
      case 'echo':
        this.emit(tup.values, { anchors, needTaskIds: false });
        break;
      case 'emit': {
        const [values, stream] = args;
        const ids = await this.emit(values, { stream, anchors, needTaskIds: true });
        this.emit(['task_ids', ids], { anchors, needTaskIds: false });
        break;
      }
      case 'emit_unanchored':
        this.emit(args[0], NF);
        break;
      case 'emit_direct':
        this.emitDirect(args[0], args[1], { anchors });
        break;
      case 'emit_many':
        for (let i = 0; i < args[0]; i++) this.emit(['n', i], { anchors, needTaskIds: false });
        break;
      case 'hold':
        this.held.push(tup);
        return;
      case 'release': {
        const held = this.held;
        this.held = [];
        this.emit(args[0], { anchors: [...held, tup], needTaskIds: false });
        for (const h of held) this.ack(h);
        break;
      }
      case 'log':
        this.log(args[0], args[1]);
        break;
      case 'error':
        this.reportError(args[0]);
        break;
      case 'metrics':
        this.metrics(args[0], args[1]);
        break;
      case 'print':
        console.log(args[0]);
        break;
      case 'exit':
        process.exit(args[0]);
        break;
      default:
        this.reportError(`unknown action: ${show(action)}`);
        this.fail(tup);
        return;
    }
    this.ack(tup);
  }

  processTick(tup) {
    this.emit(['tick', tup.values[0]], { anchors: [tup], needTaskIds: false });
    this.ack(tup);
  }
}

class ConformanceBasicBolt extends BasicBolt {
  initialize() {
    this.log(READY);
  }

  process(tup) {
    const [action, arg] = tup.values;
    if (action === 'echo') this.emit(tup.values);
    else if (action === 'raise') throw new Error(String(arg));
  }

  processTick(tup) {
    this.emit(['tick', tup.values[0]]);
  }
}

// Mode `stateful`: a StatefulBolt (spec §9.7) whose tuples edit its state.
class ConformanceStatefulBolt extends StatefulBolt {
  initialize() {
    this.log(READY);
  }

  process(tup) {
    const [action, key, value] = tup.values;
    if (action === 'put') this.state.put(key, value);
    else if (action === 'delete') this.state.delete(key);
    else if (action === 'get') this.emit([key, this.state.get(key, null)], { anchors: [tup], needTaskIds: false });
    else this.fail(tup);
  }
}

const IDS = [0, '1', -2, '-3', 4.5, { k: [5] }, null];

class ConformanceSpout extends Spout {
  open() {
    this.k = 0;
    this.log(READY);
    this.emit(['open'], { msgId: 'open' });
  }

  activate() { this.emit(['activated']); }

  deactivate() { this.emit(['deactivated']); }

  async nextTuple() {
    if (this.k >= IDS.length) return;
    const k = this.k++;
    const ids = await this.emit(['next', k], { msgId: IDS[k], needTaskIds: true });
    this.emit(['task_ids', ids]);
  }

  ack(id) { this.emit(['acked', id]); }

  fail(id) { this.emit(['failed', id]); }
}

const classes = {
  bolt: ConformanceBolt, basic: ConformanceBasicBolt, spout: ConformanceSpout, stateful: ConformanceStatefulBolt,
};
if (!Object.prototype.hasOwnProperty.call(classes, MODE)) {
  console.error(`usage: conformance_component.js [bolt|basic|spout|stateful] (got ${JSON.stringify(MODE)})`);
  process.exit(2);
}
new classes[MODE]().run();
