'use strict';
/*
 * multilang.js — Apache Storm multilang component library for Node.js
 * (single file, CommonJS, core modules only).
 *
 * Speaks Storm's standard multilang protocol, so components built on it run
 * both under multilang-bridge and under Storm's own ShellBolt / ShellSpout.
 * When the host offers the `batch` extension (conf "multilang.extensions",
 * spec §9) it is accepted: input tuples may then arrive many per frame, and
 * emits that want no task ids, acks and fails are collected into `batch`
 * frames, written at the end of each event-loop turn. `static extensions = []`
 * in a subclass (or `component.extensions = []` before run()) keeps the
 * standard protocol only.
 *
 *   const { BasicBolt } = require('./multilang');
 *   class Upper extends BasicBolt {
 *     process(tup) { this.emit([String(tup.values[0]).toUpperCase()]); }
 *   }
 *   new Upper().run();
 *
 * Hooks may be synchronous or return a promise. Bolt input tuples are handled
 * one at a time, in arrival order. Task-id replies bypass that queue, so a hook
 * may `await this.emit(values, {needTaskIds: true})` without deadlocking.
 *
 * needTaskIds defaults to FALSE: a round trip per emit is the main throughput
 * killer of multilang. Pass `{needTaskIds: true}` to get a Promise of the ids
 * (as pystorm does).
 *
 * stdout belongs to the protocol. Loading this module installs a guard:
 * console.log / console.info / process.stdout.write become `log` frames
 * (buffered until the handshake reply has been written); console.error still
 * goes to stderr. `restoreStdout()` removes the guard.
 */

const fs = require('fs');
const path = require('path');
const { StringDecoder } = require('string_decoder');

const LOG_LEVELS = Object.freeze({ TRACE: 0, DEBUG: 1, INFO: 2, WARN: 3, ERROR: 4 });
const BATCH_MAX = 1024;   // elements per output batch: far below any frame limit
const DONE = Symbol('multilang.done');

// ---------------------------------------------------------------------------
// Output: one writer for the whole process (there is only one stdout).
// ---------------------------------------------------------------------------

const stdout = process.stdout;
const rawWrite = stdout.write.bind(stdout);
let guardedWrite = null;

const out = {
  ready: false,       // true once the {"pid": N} reply has been queued
  early: [],          // frames produced before the handshake reply
  buf: [],            // encoded frames waiting for the next flush
  scheduled: false,
  batching: false,    // extension batch accepted (spec §9.5)
  emits: [],          // the output batch being filled
  acks: [],
  fails: [],
  bsize: 0,

  send(obj) {
    const text = JSON.stringify(obj) + '\nend\n';
    if (!this.ready) { this.early.push(text); return; }
    if (this.bsize > 0) this.closeBatch();   // §9.5: keep the order of calls
    this.buf.push(text);
    if (!this.scheduled) {
      this.scheduled = true;
      setImmediate(() => this.flush());
    }
  },

  // Batch mode: one element of the output batch. An emit is
  // [values, anchorsOrMsgId, stream] with trailing nulls left out.
  batchEmit(elem) { this.emits.push(elem); this.batchAdded(); },
  batchAck(id) { this.acks.push(id); this.batchAdded(); },
  batchFail(id) { this.fails.push(id); this.batchAdded(); },

  batchAdded() {
    if (++this.bsize >= BATCH_MAX) this.closeBatch();
    if (!this.scheduled) {
      this.scheduled = true;
      setImmediate(() => this.flush());
    }
  },

  closeBatch() {
    if (this.bsize === 0) return;
    const frame = { command: 'batch' };
    if (this.emits.length > 0) { frame.emits = this.emits; this.emits = []; }
    if (this.acks.length > 0) { frame.acks = this.acks; this.acks = []; }
    if (this.fails.length > 0) { frame.fails = this.fails; this.fails = []; }
    this.bsize = 0;
    this.buf.push(JSON.stringify(frame) + '\nend\n');
  },

  sendPid(pid, extensions) {
    const reply = { pid };
    if (extensions && extensions.length > 0) reply.extensions = extensions;
    this.batching = !!extensions && extensions.includes('batch');
    this.buf.push(JSON.stringify(reply) + '\nend\n');
    for (const t of this.early) this.buf.push(t);
    this.early = [];
    this.ready = true;
    this.flush();
  },

  pending: 0,        // writes handed to stdout and not yet completed
  waiters: [],       // callbacks to run once everything has been written

  flush() {
    this.scheduled = false;
    if (this.bsize > 0) this.closeBatch();
    if (this.buf.length === 0) return;
    const data = this.buf.length === 1 ? this.buf[0] : this.buf.join('');
    this.buf = [];
    this.pending++;
    try {
      rawWrite(data, 'utf8', () => this.written());
    } catch (e) {
      this.written();
    }
  },

  written() {
    this.pending--;
    if (this.pending === 0 && this.waiters.length > 0) {
      const waiters = this.waiters;
      this.waiters = [];
      for (const w of waiters) w();
    }
  },

  /** Flush, then call cb once stdout has taken every byte (async pipes!). */
  drain(cb) {
    if (this.ready) this.flush();
    if (this.pending === 0) process.nextTick(cb);
    else this.waiters.push(cb);
  },
};

// process.exit() from user code: hand over what is still buffered (best
// effort: libuv writes it at once if the pipe has room; the normal paths
// below wait for out.drain() instead).
process.on('exit', () => { if (out.ready) out.flush(); });
// The host went away: nothing more can be said.
stdout.on('error', () => process.exit(0));

function chunkToString(chunk, encoding) {
  if (typeof chunk === 'string') return chunk;
  if (Buffer.isBuffer(chunk)) return chunk.toString(typeof encoding === 'string' ? encoding : 'utf8');
  if (chunk instanceof Uint8Array) return Buffer.from(chunk).toString('utf8');
  return String(chunk);
}

/** Route process.stdout.write (thus console.log / console.info) to log frames. */
function installStdoutGuard() {
  if (guardedWrite) return;
  guardedWrite = function write(chunk, encoding, cb) {
    if (typeof encoding === 'function') { cb = encoding; encoding = undefined; }
    let msg = chunkToString(chunk, encoding);
    if (msg.endsWith('\r\n')) msg = msg.slice(0, -2);
    else if (msg.endsWith('\n')) msg = msg.slice(0, -1);
    out.send({ command: 'log', msg });
    if (typeof cb === 'function') process.nextTick(cb);
    return true;
  };
  stdout.write = guardedWrite;
}

/** Give process.stdout.write back its original behaviour. */
function restoreStdout() {
  if (!guardedWrite) return;
  delete stdout.write;                 // the prototype's write shows through again
  if (typeof stdout.write !== 'function') stdout.write = rawWrite;
  guardedWrite = null;
}

installStdoutGuard();

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

function isThenable(x) {
  return x !== null && (typeof x === 'object' || typeof x === 'function') && typeof x.then === 'function';
}

/**
 * Run fn(); then onOk() or onErr(e). Synchronous when fn is; otherwise returns
 * a promise that settles after the callback ran.
 */
function settle(fn, onOk, onErr) {
  let r;
  try {
    r = fn();
  } catch (e) {
    onErr(e);
    return undefined;
  }
  if (isThenable(r)) return Promise.resolve(r).then(() => onOk(), (e) => onErr(e));
  onOk();
  return undefined;
}

function errorText(err) {
  if (err instanceof Error) {
    const stack = typeof err.stack === 'string' ? err.stack : '';
    const head = `${err.name || 'Error'}: ${err.message}`;
    if (!stack) return head;
    return stack.includes(err.message) ? stack : `${head}\n${stack}`;
  }
  try {
    return typeof err === 'string' ? err : `Uncaught value: ${JSON.stringify(err)}`;
  } catch (_) {
    return String(err);
  }
}

function tupleId(t) {
  return t instanceof Tuple ? t.id : t;
}

// ---------------------------------------------------------------------------
// Tuple
// ---------------------------------------------------------------------------

class Tuple {
  /**
   * @param {string} id       as received, never converted to a number
   * @param {string} component
   * @param {string} stream
   * @param {number} task
   * @param {Array}  values
   */
  constructor(id, component, stream, task, values) {
    this.id = id;
    this.component = component;
    this.stream = stream;
    this.task = task;
    this.values = values;
  }

  static fromFrame(msg) {
    return new Tuple(msg.id, msg.comp, msg.stream, msg.task,
      Array.isArray(msg.tuple) ? msg.tuple : []);
  }

  isTick() { return this.component === '__system' && this.stream === '__tick'; }

  isHeartbeat() { return this.stream === '__heartbeat'; }

  toString() {
    return `Tuple(id=${this.id}, component=${this.component}, stream=${this.stream}, ` +
      `task=${this.task}, values=${JSON.stringify(this.values)})`;
  }
}

// Not acked or failed yet: inherited, so constructing a tuple (once per input,
// thousands per batch) does not define a property; ack/fail set an own one.
Object.defineProperty(Tuple.prototype, DONE, { value: false, writable: true, enumerable: false });

// ---------------------------------------------------------------------------
// Component: protocol loop shared by bolts and spouts
// ---------------------------------------------------------------------------

let running = null;

class Component {
  /**
   * Extensions accepted when the host offers them (spec §9). Override with
   * `static extensions = []` in a subclass, or set `this.extensions` on an
   * instance, to speak the standard protocol only.
   */
  static extensions = ['batch'];

  constructor() {
    this.conf = null;
    this.context = null;
    this.pidDir = null;
    this._queue = [];           // frames waiting to be handled (not task ids)
    this._qhead = 0;
    this._busy = false;         // an async handler is in progress
    this._pendingIds = [];      // FIFO of resolvers for emits awaiting task ids
    this._handshaken = false;
    this._eof = false;
    this._exiting = false;
  }

  // ---- commands available to every component ----------------------------

  /** Log through the host. level: 0..4 = TRACE DEBUG INFO WARN ERROR (default INFO). */
  log(msg, level = LOG_LEVELS.INFO) {
    const frame = { command: 'log', msg: typeof msg === 'string' ? msg : String(msg) };
    if (level !== undefined && level !== null) frame.level = level;
    out.send(frame);
  }

  /** Report an error to the host (command "error"); not fatal. */
  reportError(msg) {
    out.send({ command: 'error', msg: msg instanceof Error ? errorText(msg) : String(msg) });
  }

  /** Send a metrics frame. */
  metrics(name, params) {
    out.send({ command: 'metrics', name, params: params === undefined ? null : params });
  }

  // ---- emitting -----------------------------------------------------------

  /** The extensions this component accepts: the instance's, else its class's. */
  _acceptedExtensions() {
    const mine = this.extensions !== undefined ? this.extensions : this.constructor.extensions;
    return Array.isArray(mine) ? mine.map(String) : [];
  }

  _sendEmit(frame, needTaskIds) {
    if (needTaskIds) {
      const p = new Promise((resolve) => this._pendingIds.push(resolve));
      out.send(frame);
      return p;
    }
    frame.need_task_ids = false;
    out.send(frame);
    return undefined;
  }

  // ---- main loop ------------------------------------------------------------

  /** Start speaking the protocol on stdin/stdout. Returns this. */
  run() {
    if (running) throw new Error('multilang: a component is already running in this process');
    running = this;
    installStdoutGuard();
    const decoder = new StringDecoder('utf8');
    const lines = [];
    let partial = '';
    const input = process.stdin;

    // Lines end with \n, \r\n or a lone \r (spec §1.2). A \r that ends a
    // chunk ends its line; a \n starting the next chunk is then its tail.
    const lineBreak = /\r\n|\r|\n/g;
    let skipLF = false;
    const feed = (text) => {
      if (!text) return;
      let data = partial + text;
      let start = 0;
      if (skipLF && data[0] === '\n') start = 1;
      skipLF = false;
      lineBreak.lastIndex = start;
      let m;
      while ((m = lineBreak.exec(data)) !== null) {
        const line = data.slice(start, m.index);
        start = m.index + m[0].length;
        if (m[0] === '\r' && start === data.length) skipLF = true;
        if (line === 'end') {
          const frame = lines.join('\n');
          lines.length = 0;
          this._onFrame(frame);
        } else {
          lines.push(line);
        }
      }
      partial = start === 0 ? data : data.slice(start);
      data = null;
    };

    input.on('data', (chunk) => feed(decoder.write(chunk)));
    input.on('end', () => {
      feed(decoder.end());
      if (partial === 'end' || partial === 'end\r') { partial = ''; this._onFrame(lines.join('\n')); }
      this._onEof();
    });
    input.on('error', () => this._onEof());
    input.resume();

    process.on('uncaughtException', (err) => {
      try { process.stderr.write(`multilang: uncaught exception: ${errorText(err)}\n`); } catch (_) { /* */ }
      if (out.ready) this.reportError(errorText(err));
      this._exiting = true;
      out.drain(() => process.exit(1));
      setTimeout(() => process.exit(1), 2000).unref();
    });
    return this;
  }

  _onFrame(text) {
    if (text.trim() === '') return;   // stray "end" with nothing before it
    let msg;
    try {
      msg = JSON.parse(text);
    } catch (e) {
      const shown = text.length > 200 ? text.slice(0, 200) + '...' : text;
      process.stderr.write(`multilang: cannot parse frame from host: ${e.message}: ${JSON.stringify(shown)}\n`);
      if (out.ready) this.log(`cannot parse frame from host: ${JSON.stringify(shown)}`, LOG_LEVELS.ERROR);
      return;
    }
    if (!this._handshaken) {
      this._handshaken = true;
      this._enqueue({ handshake: msg });
      return;
    }
    if (Array.isArray(msg)) {
      // Task ids: resolve the oldest pending emit at once (never queued).
      const resolve = this._pendingIds.shift();
      if (resolve) resolve(msg);
      else this.log(`unexpected task id list from host: ${JSON.stringify(msg)}`, LOG_LEVELS.WARN);
      return;
    }
    const tuples = msg !== null && typeof msg === 'object' ? msg.tuples : undefined;
    if (Array.isArray(tuples) && this instanceof Bolt) {
      // §9.5: a tuple batch is the same tuples as standard frames, in order.
      // (Parsed as they arrive, possibly before the handshake is answered.)
      const q = this._queue;
      for (let i = 0; i < tuples.length; i++) {
        const t = tuples[i];
        q.push(Array.isArray(t) ? new Tuple(t[0], t[1], t[2], t[3], Array.isArray(t[4]) ? t[4] : []) : t);
      }
      this._pump();
      return;
    }
    this._enqueue(msg);
  }

  _enqueue(item) {
    this._queue.push(item);
    this._pump();
  }

  _pump() {
    if (this._busy || this._exiting) return;
    while (this._qhead < this._queue.length) {
      const item = this._queue[this._qhead];
      this._queue[this._qhead++] = undefined;
      if (this._qhead > 1024 && this._qhead * 2 > this._queue.length) {
        this._queue = this._queue.slice(this._qhead);
        this._qhead = 0;
      }
      let r;
      try {
        r = item && item.handshake !== undefined ? this._handshake(item.handshake) : this._dispatch(item);
      } catch (e) {
        this.reportError(errorText(e));
        r = undefined;
      }
      if (isThenable(r)) {
        this._busy = true;
        const next = () => { this._busy = false; this._pump(); };
        r.then(next, (e) => { this.reportError(errorText(e)); next(); });
        return;
      }
      if (this._exiting) return;
    }
    this._queue.length = 0;
    this._qhead = 0;
    if (this._eof) this._exit();
  }

  _handshake(msg) {
    this.conf = (msg && msg.conf) || {};
    this.context = (msg && msg.context) || {};
    this.pidDir = msg && msg.pidDir;
    const pid = process.pid;
    // §9.1, §9.2: accept the offered extensions this component knows.
    const offered = this.conf['multilang.extensions'];
    const accepted = Array.isArray(offered)
      ? [...new Set(this._acceptedExtensions())].filter((e) => offered.includes(e))
      : [];
    const reply = () => {
      out.sendPid(pid, accepted);
      return this._startHook(this.conf, this.context);
    };
    if (typeof this.pidDir !== 'string' || this.pidDir === '') {
      process.stderr.write('multilang: handshake without pidDir\n');
      return reply();
    }
    return fs.promises.writeFile(path.join(this.pidDir, String(pid)), '')
      .catch((e) => process.stderr.write(`multilang: cannot create pid file: ${e.message}\n`))
      .then(reply);
  }

  _startHook() { return undefined; }

  _dispatch() { return undefined; }

  _onEof() {
    if (this._eof) return;
    this._eof = true;
    // Anything awaiting task ids can never complete now.
    if (!this._busy || this._pendingIds.length > 0) { this._exit(); return; }
    // Let an in-flight handler finish briefly, then go regardless.
    setTimeout(() => this._exit(), 1000).unref();
  }

  _exit() {
    if (this._exiting) return;
    this._exiting = true;
    out.drain(() => process.exit(0));
    // A host that stopped reading our stdout must not keep us alive forever.
    setTimeout(() => process.exit(0), 5000).unref();
  }
}

// ---------------------------------------------------------------------------
// Bolts
// ---------------------------------------------------------------------------

class Bolt extends Component {
  constructor() {
    super();
    this._current = null;
  }

  /** Hook: called once after the handshake. May return a promise. */
  initialize(conf, context) { } // eslint-disable-line no-unused-vars

  /** Hook: called for each input tuple (never ticks or heartbeats). */
  process(tup) { } // eslint-disable-line no-unused-vars

  /** Hook: called for tick tuples. Default: ack. */
  processTick(tup) { this.ack(tup); }

  /**
   * Emit a tuple.
   * @param {Array} values
   * @param {{stream?: string, anchors?: Array<Tuple|string>|Tuple|string, needTaskIds?: boolean}} opts
   * @returns {Promise<number[]>|undefined} a promise of the task ids when needTaskIds is true
   */
  emit(values, { stream, anchors, needTaskIds = false } = {}) {
    if (out.batching && !needTaskIds) {
      // §9.5: [values, anchors, stream], trailing nulls and [] left out.
      if (!Array.isArray(values)) throw new TypeError('emit: values must be an array');
      const ids = this._anchorIds(anchors);
      if (stream !== undefined && stream !== null && stream !== 'default') {
        out.batchEmit([values, ids.length > 0 ? ids : null, stream]);
      } else {
        out.batchEmit(ids.length > 0 ? [values, ids] : [values]);
      }
      return undefined;
    }
    const frame = this._emitFrame(values, stream, anchors);
    return this._sendEmit(frame, !!needTaskIds);
  }

  /** Emit directly to task `task` (never answered with task ids). */
  emitDirect(task, values, { stream, anchors } = {}) {
    const frame = this._emitFrame(values, stream, anchors);
    frame.task = task;
    this._sendEmit(frame, false);
  }

  _emitFrame(values, stream, anchors) {
    if (!Array.isArray(values)) throw new TypeError('emit: values must be an array');
    const frame = { command: 'emit', tuple: values };
    if (stream !== undefined && stream !== null && stream !== 'default') frame.stream = stream;
    frame.anchors = this._anchorIds(anchors);
    return frame;
  }

  _anchorIds(anchors) {
    if (anchors === undefined || anchors === null) return [];
    if (!Array.isArray(anchors)) return [tupleId(anchors)];
    if (anchors.length === 1) return [tupleId(anchors[0])];
    return anchors.map(tupleId);
  }

  /** Ack an input tuple (Tuple or id string). */
  ack(tup) {
    this._markDone(tup);
    if (out.batching) out.batchAck(tupleId(tup));
    else out.send({ command: 'ack', id: tupleId(tup) });
  }

  /** Fail an input tuple (Tuple or id string). */
  fail(tup) {
    this._markDone(tup);
    if (out.batching) out.batchFail(tupleId(tup));
    else out.send({ command: 'fail', id: tupleId(tup) });
  }

  _markDone(tup) {
    if (tup instanceof Tuple) tup[DONE] = true;
    else if (this._current && this._current.id === tup) this._current[DONE] = true;
  }

  _startHook(conf, context) { return this.initialize(conf, context); }

  _dispatch(msg) {
    let tup;
    if (msg instanceof Tuple) {
      tup = msg;                      // from a tuple batch (§9.5)
    } else if (msg === null || typeof msg !== 'object' || !('tuple' in msg || 'stream' in msg)) {
      this.log(`ignoring unexpected frame from host: ${JSON.stringify(msg)}`, LOG_LEVELS.WARN);
      return undefined;
    } else {
      tup = Tuple.fromFrame(msg);
    }
    if (tup.isHeartbeat()) {
      out.send({ command: 'sync' });
      return undefined;
    }
    this._current = tup;
    const hook = tup.isTick() ? () => this.processTick(tup) : () => this.process(tup);
    return settle(hook, () => this._finish(tup, null, false), (e) => this._finish(tup, e, true));
  }

  /**
   * After process/processTick settled. A plain Bolt that throws reports the
   * error and exits with status 1, as storm.py does and as our Python and
   * Ruby libraries do: the host fails its in-flight tuples (so they are
   * replayed) and restarts the process.
   */
  _finish(tup, err, failed) {
    this._current = null;
    if (failed) {
      this.reportError(errorText(err));
      this._exiting = true;
      out.drain(() => process.exit(1));
      setTimeout(() => process.exit(1), 2000).unref();
    }
  }
}

class BasicBolt extends Bolt {
  /** Like Bolt.emit, but anchors to the current input when `anchors` is not given. */
  emit(values, { stream, anchors, needTaskIds = false } = {}) {
    return super.emit(values, { stream, anchors: this._autoAnchor(anchors), needTaskIds });
  }

  emitDirect(task, values, { stream, anchors } = {}) {
    return super.emitDirect(task, values, { stream, anchors: this._autoAnchor(anchors) });
  }

  _autoAnchor(anchors) {
    if ((anchors === undefined || anchors === null) && this._current) return [this._current];
    return anchors;
  }

  _finish(tup, err, failed) {
    this._current = null;
    if (failed) {
      this.reportError(errorText(err));
      if (!tup[DONE]) this.fail(tup);
    } else if (!tup[DONE]) {
      this.ack(tup);
    }
  }
}

// ---------------------------------------------------------------------------
// Spout
// ---------------------------------------------------------------------------

class Spout extends Component {
  /** Hook: called once after the handshake; emits here are legal. */
  open(conf, context) { } // eslint-disable-line no-unused-vars

  /** Hook: "next" command. */
  nextTuple() { }

  /** Hook: a reliable emit with this message id completed. */
  ack(msgId) { } // eslint-disable-line no-unused-vars

  /** Hook: a reliable emit with this message id failed. */
  fail(msgId) { } // eslint-disable-line no-unused-vars

  activate() { }

  deactivate() { }

  /**
   * Emit a tuple. msgId undefined/null = unreliable (0 is a reliable id).
   * @returns {Promise<number[]>|undefined}
   */
  emit(values, { stream, msgId, needTaskIds = false } = {}) {
    if (out.batching && !needTaskIds) {
      // §9.5: [values, msgId, stream], trailing nulls left out.
      if (!Array.isArray(values)) throw new TypeError('emit: values must be an array');
      const id = msgId === undefined ? null : msgId;
      if (stream !== undefined && stream !== null && stream !== 'default') out.batchEmit([values, id, stream]);
      else out.batchEmit(id === null ? [values] : [values, id]);
      return undefined;
    }
    return this._sendEmit(this._emitFrame(values, stream, msgId), !!needTaskIds);
  }

  /** Emit directly to task `task` (never answered with task ids). */
  emitDirect(task, values, { stream, msgId } = {}) {
    const frame = this._emitFrame(values, stream, msgId);
    frame.task = task;
    this._sendEmit(frame, false);
  }

  _emitFrame(values, stream, msgId) {
    if (!Array.isArray(values)) throw new TypeError('emit: values must be an array');
    const frame = { command: 'emit', tuple: values };
    if (stream !== undefined && stream !== null && stream !== 'default') frame.stream = stream;
    if (msgId !== undefined && msgId !== null) frame.id = msgId;
    return frame;
  }

  _startHook(conf, context) { return this.open(conf, context); }

  _dispatch(msg) {
    const cmd = msg !== null && typeof msg === 'object' ? msg.command : undefined;
    let hook;
    switch (cmd) {
      case 'next': hook = () => this.nextTuple(); break;
      case 'ack': hook = () => this.ack(msg.id); break;
      case 'fail': hook = () => this.fail(msg.id); break;
      case 'activate': hook = () => this.activate(); break;
      case 'deactivate': hook = () => this.deactivate(); break;
      default:
        hook = () => this.log(`unknown command from host: ${JSON.stringify(msg)}`, LOG_LEVELS.WARN);
    }
    const sync = () => out.send({ command: 'sync' });
    return settle(hook, sync, (e) => { this.reportError(errorText(e)); sync(); });
  }
}

module.exports = {
  Tuple,
  Component,
  Bolt,
  BasicBolt,
  Spout,
  LOG_LEVELS,
  installStdoutGuard,
  restoreStdout,
};
