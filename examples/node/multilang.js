'use strict';
/*
 * multilang.js — Apache Storm multilang component library for Node.js
 * (single file, CommonJS, core modules only).
 *
 * Speaks Storm's standard multilang protocol, so components built on it run
 * both under multilang-bridge and under Storm's own ShellBolt / ShellSpout.
 * When the host offers the `batch` extension (the handshake's "extensions",
 * spec §9) it is accepted: input tuples may then arrive many per frame, and
 * emits that want no task ids, acks and fails are collected into `batch`
 * frames, written at the end of each event-loop turn. When the host offers
 * `msgpack` (spec §9.6) it is accepted too: after the JSON handshake and pid
 * reply every frame, both ways, is a 4-byte big-endian length followed by one
 * MessagePack object (JSON's data model only; combines with `batch`).
 * When the host offers `state` (spec §9.7) a StatefulBolt accepts it: the
 * host keeps the bolt's key-value state durable (init at start, prepare /
 * commit / rollback at its checkpoints); without it (Storm's host) the state
 * is kept in memory. Plain bolts and spouts never accept `state`.
 * Opt-out: `static extensions = ['batch']` in a subclass (or
 * `component.extensions = ['batch']` before run()) declines msgpack only
 * (a StatefulBolt's default is ['batch', 'msgpack', 'state']: keep 'state' in
 * such a list); `static extensions = []` keeps the standard protocol only.
 *
 *   const { BasicBolt } = require('./multilang');
 *   class Upper extends BasicBolt {
 *     process(tup) { this.emit([String(tup.values[0]).toUpperCase()]); }
 *   }
 *   new Upper().run();
 *
 *   const { StatefulBolt } = require('./multilang');
 *   class Counter extends StatefulBolt {       // this.state: get put delete has size entries
 *     process(tup) {
 *       const n = this.state.get(tup.values[0], 0) + 1;
 *       this.state.put(tup.values[0], n);
 *       this.emit([tup.values[0], n]);
 *     }
 *   }
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
const HALFWAY_FLUSH_MIN = 16;   // a chunk of at least this many frames is also flushed halfway
const FRAME_END_BYTES = Buffer.from('\nend\n');
const DONE = Symbol('multilang.done');

// ---------------------------------------------------------------------------
// MessagePack (extension msgpack, spec §9.6): JSON's data model only.
//
// Encoder: values are written straight into one growable output slab (see
// `out`), as JSON.stringify would see them: integers (Number.isInteger, within
// 64 bits) in their shortest int form, other finite numbers as float 64,
// NaN / Infinity / undefined / functions in arrays as nil (JSON: null),
// undefined / function members of objects left out, toJSON() honoured, BigInt
// a TypeError (as JSON.stringify). Integers outside [-2^63, 2^64) go out as
// float 64 (JSON would print them as 1e+300 and the like). A lone surrogate
// in a string becomes U+FFFD (a str must be UTF-8; JSON would \u-escape it).
//
// Decoder: a position index over one Buffer. int 64 / uint 64 become the
// nearest Number, exactly as JSON.parse reads a 64-bit integer written in
// decimal: integers up to 2^53 are exact, larger ones lose their low bits
// (never BigInt, so a value behaves the same whichever encoding brought it).
// float 32 is accepted. bin, ext, non-string map keys, invalid UTF-8, trailing
// bytes and truncated objects are protocol errors (MsgpackError).
// ---------------------------------------------------------------------------

const { isUtf8 } = require('buffer');

const MAX_FRAME_BYTES = 67108864;   // spec §1.3 default, multilang.max.frame.bytes
const SLAB_BYTES = 64 * 1024;
const TWO32 = 4294967296;

class MsgpackError extends Error {
  constructor(message) {
    super(message);
    this.name = 'MsgpackError';
  }
}

const utf8Fatal = typeof isUtf8 === 'function' ? null : new TextDecoder('utf-8', { fatal: true });
function validUtf8(buf, a, b) {
  if (utf8Fatal === null) return isUtf8(buf.subarray(a, b));
  try { utf8Fatal.decode(buf.subarray(a, b)); return true; } catch (_) { return false; }
}

// ---- encoder ----------------------------------------------------------------
// EB[ES, EO) holds encoded frames not yet handed to stdout. Bytes before ES
// may still be referenced by a pending stdout write, so they are not written
// again until every write has completed (out.written() then rewinds to 0);
// growing allocates a new slab (copying only [ES, EO)).

let EB = Buffer.allocUnsafe(SLAB_BYTES);
let ES = 0;
let EO = 0;

function mpEnsure(n) {
  if (EO + n <= EB.length) return;
  const used = EO - ES;
  const nb = Buffer.allocUnsafe(Math.max(SLAB_BYTES, (used + n) * 2));
  EB.copy(nb, 0, ES, EO);
  EB = nb;
  ES = 0;
  EO = used;
}

function mpString(s) {
  const n = s.length;
  if (n < 32) {
    // Short: ASCII written by hand (no call into C++); else the general path.
    if (EO + 1 + n > EB.length) mpEnsure(1 + n);
    const buf = EB;
    const at = EO;
    let i = 0;
    for (; i < n; i++) {
      const c = s.charCodeAt(i);
      if (c >= 0x80) break;
      buf[at + 1 + i] = c;
    }
    if (i === n) {
      buf[at] = 0xa0 | n;
      EO = at + 1 + n;
      return;
    }
  }
  const len = Buffer.byteLength(s, 'utf8');
  mpEnsure(5 + len);
  if (len < 32) {
    EB[EO++] = 0xa0 | len;
  } else if (len < 0x100) {
    EB[EO++] = 0xd9; EB[EO++] = len;
  } else if (len < 0x10000) {
    EB[EO++] = 0xda; EB.writeUInt16BE(len, EO); EO += 2;
  } else {
    EB[EO++] = 0xdb; EB.writeUInt32BE(len, EO); EO += 4;
  }
  EO += EB.write(s, EO, len, 'utf8');
}

function mpNumber(v) {
  if (!Number.isFinite(v)) {         // JSON.stringify: null
    mpEnsure(1); EB[EO++] = 0xc0;
    return;
  }
  mpEnsure(9);
  if (Number.isInteger(v)) {
    if (v >= 0) {
      if (v < 0x80) { EB[EO++] = v; return; }
      if (v < 0x100) { EB[EO++] = 0xcc; EB[EO++] = v; return; }
      if (v < 0x10000) { EB[EO++] = 0xcd; EB.writeUInt16BE(v, EO); EO += 2; return; }
      if (v < TWO32) { EB[EO++] = 0xce; EB.writeUInt32BE(v, EO); EO += 4; return; }
      if (v < 18446744073709551616) {
        const hi = Math.floor(v / TWO32);
        EB[EO++] = 0xcf; EB.writeUInt32BE(hi, EO); EB.writeUInt32BE(v - hi * TWO32, EO + 4); EO += 8;
        return;
      }
    } else {
      if (v >= -32) { EB[EO++] = v & 0xff; return; }
      if (v >= -0x80) { EB[EO++] = 0xd0; EB.writeInt8(v, EO); EO += 1; return; }
      if (v >= -0x8000) { EB[EO++] = 0xd1; EB.writeInt16BE(v, EO); EO += 2; return; }
      if (v >= -0x80000000) { EB[EO++] = 0xd2; EB.writeInt32BE(v, EO); EO += 4; return; }
      if (v >= -9223372036854775808) {
        const hi = Math.floor(v / TWO32);  // exact: v and hi * 2^32 are integers below 2^64
        EB[EO++] = 0xd3; EB.writeInt32BE(hi, EO); EB.writeUInt32BE(v - hi * TWO32, EO + 4); EO += 8;
        return;
      }
    }
  }
  EB[EO++] = 0xcb; EB.writeDoubleBE(v, EO); EO += 8;
}

function mpHeader(n, fix, c16) {
  mpEnsure(5);
  if (n < 16) {
    EB[EO++] = fix | n;
  } else if (n < 0x10000) {
    EB[EO++] = c16; EB.writeUInt16BE(n, EO); EO += 2;
  } else {
    EB[EO++] = c16 + 1; EB.writeUInt32BE(n, EO); EO += 4;
  }
}

/** A member value as JSON.stringify sees it; undefined = leave the member out. */
function jsonValue(v, key) {
  if (v !== null && (typeof v === 'object' || typeof v === 'bigint') && typeof v.toJSON === 'function') {
    v = v.toJSON(key);
  }
  const t = typeof v;
  return t === 'undefined' || t === 'function' || t === 'symbol' ? undefined : v;
}

function mpValue(v) {
  switch (typeof v) {
    case 'string': mpString(v); return;
    case 'number': mpNumber(v); return;
    case 'boolean': mpEnsure(1); EB[EO++] = v ? 0xc3 : 0xc2; return;
    case 'object': break;
    case 'bigint':
      if (typeof v.toJSON === 'function') { mpValue(jsonValue(v, '')); return; }
      throw new TypeError('Do not know how to serialize a BigInt');
    default:                            // undefined, function, symbol: null
      mpEnsure(1); EB[EO++] = 0xc0; return;
  }
  if (v === null) { mpEnsure(1); EB[EO++] = 0xc0; return; }
  if (Array.isArray(v)) {
    const n = v.length;
    mpHeader(n, 0x90, 0xdc);
    for (let i = 0; i < n; i++) {
      const x = v[i];
      if (x !== null && typeof x === 'object' && typeof x.toJSON === 'function') mpValue(x.toJSON(String(i)));
      else mpValue(x);
    }
    return;
  }
  if (typeof v.toJSON === 'function') { mpValue(jsonValue(v, '')); return; }
  if (v instanceof Number || v instanceof String || v instanceof Boolean) { mpValue(v.valueOf()); return; }
  const keys = Object.keys(v);
  if (keys.length < 16) {
    // At most 15 members: a fixmap whose count is patched at the end.
    mpEnsure(1);
    const at = EO - ES;                 // relative: the slab may be replaced meanwhile
    EO++;
    let count = 0;
    for (let i = 0; i < keys.length; i++) {
      const k = keys[i];
      const x = jsonValue(v[k], k);
      if (x === undefined) continue;
      mpString(k);
      mpValue(x);
      count++;
    }
    EB[ES + at] = 0x80 | count;
    return;
  }
  const members = [];
  for (let i = 0; i < keys.length; i++) {
    const x = jsonValue(v[keys[i]], keys[i]);
    if (x !== undefined) members.push(keys[i], x);
  }
  mpHeader(members.length / 2, 0x80, 0xde);
  for (let i = 0; i < members.length; i += 2) {
    mpString(members[i]);
    mpValue(members[i + 1]);
  }
}

let mpBusy = false;   // a frame is being encoded (a toJSON() must not send one)

/** Append one frame (4-byte big-endian length + the object) to the slab. */
function mpFrame(obj) {
  if (mpBusy) throw new Error('multilang: cannot send a frame while encoding one (from a toJSON method?)');
  mpEnsure(4);
  const at = EO - ES;
  EO += 4;
  mpBusy = true;
  try {
    mpValue(obj);
  } catch (e) {
    EO = ES + at;                       // no half-written frame
    throw e;
  } finally {
    mpBusy = false;
  }
  const start = ES + at;
  EB.writeUInt32BE(EO - start - 4, start);
}

/** One value as a standalone MessagePack Buffer (a copy). */
function encodeMsgpack(value) {
  if (mpBusy) throw new Error('multilang: encodeMsgpack called while encoding a frame');
  const at = EO - ES;
  mpBusy = true;
  try {
    mpValue(value);
    return Buffer.from(EB.subarray(ES + at, EO));
  } finally {
    EO = ES + at;
    mpBusy = false;
  }
}

// ---- decoder ----------------------------------------------------------------

let D = null;   // the buffer being decoded
let DP = 0;     // read position
let DE = 0;     // end of the frame's body
let DS = 0;     // start of the body (offsets in messages are relative to it)

function mpFinite(v) {
  if (!Number.isFinite(v)) mpFail(`float ${v} is not a JSON number (§9.6)`);
  return v;
}

function mpFail(what) {
  throw new MsgpackError(what);
}

function mpNeed(n) {
  if (DE - DP < n) mpFail(`truncated object: ${n} more bytes needed at body offset ${DP - DS}, ${DE - DP} left`);
}

// Short ASCII strings (map keys above all: "id", "tuple", ...) come from a
// small cache, so repeated keys are one string each, not a new one per frame.
const KEY_CACHE_BITS = 10;
const keyCache = new Array(1 << KEY_CACHE_BITS).fill(null);   // [bytes, string] pairs

function mpShortAscii(a, b) {
  let h = b - a;
  for (let i = a; i < b; i++) {
    const c = D[i];
    if (c >= 0x80) return null;
    h = (Math.imul(h, 31) + c) | 0;
  }
  const slot = (h ^ (h >>> KEY_CACHE_BITS)) & ((1 << KEY_CACHE_BITS) - 1);
  const hit = keyCache[slot];
  if (hit !== null && hit[0].length === b - a) {
    const bytes = hit[0];
    let i = 0;
    while (i < bytes.length && bytes[i] === D[a + i]) i++;
    if (i === bytes.length) return hit[1];
  }
  const str = D.toString('latin1', a, b);
  keyCache[slot] = [Uint8Array.prototype.slice.call(D, a, b), str];
  return str;
}

function mpReadKey(len) {
  if (len <= 16) {
    mpNeed(len);
    const s = mpShortAscii(DP, DP + len);
    if (s !== null) { DP += len; return s; }
  }
  return mpReadString(len);
}

function mpReadString(len) {
  mpNeed(len);
  const a = DP;
  const b = DP + len;
  DP = b;
  if (len < 64) {
    let i = a;
    if (len <= 12) {
      let s = '';
      for (; i < b; i++) {
        const c = D[i];
        if (c >= 0x80) break;
        s += String.fromCharCode(c);
      }
      if (i === b) return s;
    } else {
      while (i < b && D[i] < 0x80) i++;
      if (i === b) return D.toString('latin1', a, b);
    }
  }
  if (!validUtf8(D, a, b)) mpFail(`invalid UTF-8 in a str at body offset ${a - DS}`);
  return D.toString('utf8', a, b);
}

function mpReadArray(n) {
  if (n > DE - DP) mpFail(`truncated object: an array of ${n} elements in ${DE - DP} bytes`);
  const arr = new Array(n);
  for (let i = 0; i < n; i++) arr[i] = mpRead();
  return arr;
}

function mpReadMap(n) {
  if (n * 2 > DE - DP) mpFail(`truncated object: a map of ${n} members in ${DE - DP} bytes`);
  const obj = {};
  for (let i = 0; i < n; i++) {
    const c = DP < DE ? D[DP] : -1;
    let key;
    if (c >= 0xa0 && c <= 0xbf) { DP++; key = mpReadKey(c & 0x1f); }
    else if (c === 0xd9 || c === 0xda || c === 0xdb) key = mpRead();
    else if (c === -1) mpNeed(1);
    else mpFail(`map key at body offset ${DP - DS} is not a string (type byte 0x${c.toString(16)})`);
    const value = mpRead();
    // As JSON.parse: "__proto__" is an ordinary own member, not the prototype.
    if (key === '__proto__') Object.defineProperty(obj, key, { value, writable: true, enumerable: true, configurable: true });
    else obj[key] = value;
  }
  return obj;
}

function mpRead() {
  if (DP >= DE) mpNeed(1);
  const c = D[DP++];
  if (c < 0x80) return c;                          // positive fixint
  if (c >= 0xe0) return c - 0x100;                 // negative fixint
  if (c >= 0xa0 && c <= 0xbf) return mpReadString(c & 0x1f);
  if (c <= 0x8f) return mpReadMap(c & 0x0f);
  if (c <= 0x9f) return mpReadArray(c & 0x0f);
  let v;
  switch (c) {
    case 0xc0: return null;
    case 0xc2: return false;
    case 0xc3: return true;
    case 0xca: mpNeed(4); v = D.readFloatBE(DP); DP += 4; return mpFinite(v);
    case 0xcb: mpNeed(8); v = D.readDoubleBE(DP); DP += 8; return mpFinite(v);
    case 0xcc: mpNeed(1); return D[DP++];
    case 0xcd: mpNeed(2); v = D.readUInt16BE(DP); DP += 2; return v;
    case 0xce: mpNeed(4); v = D.readUInt32BE(DP); DP += 4; return v;
    case 0xcf: mpNeed(8); v = D.readUInt32BE(DP) * TWO32 + D.readUInt32BE(DP + 4); DP += 8; return v;
    case 0xd0: mpNeed(1); return D.readInt8(DP++);
    case 0xd1: mpNeed(2); v = D.readInt16BE(DP); DP += 2; return v;
    case 0xd2: mpNeed(4); v = D.readInt32BE(DP); DP += 4; return v;
    case 0xd3: mpNeed(8); v = D.readInt32BE(DP) * TWO32 + D.readUInt32BE(DP + 4); DP += 8; return v;
    case 0xd9: mpNeed(1); return mpReadString(D[DP++]);
    case 0xda: mpNeed(2); v = D.readUInt16BE(DP); DP += 2; return mpReadString(v);
    case 0xdb: mpNeed(4); v = D.readUInt32BE(DP); DP += 4; return mpReadString(v);
    case 0xdc: mpNeed(2); v = D.readUInt16BE(DP); DP += 2; return mpReadArray(v);
    case 0xdd: mpNeed(4); v = D.readUInt32BE(DP); DP += 4; return mpReadArray(v);
    case 0xde: mpNeed(2); v = D.readUInt16BE(DP); DP += 2; return mpReadMap(v);
    case 0xdf: mpNeed(4); v = D.readUInt32BE(DP); DP += 4; return mpReadMap(v);
    case 0xc4: case 0xc5: case 0xc6:
      return mpFail(`bin value (type byte 0x${c.toString(16)}) at body offset ${DP - 1 - DS}: not in the data model`);
    case 0xc7: case 0xc8: case 0xc9: case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8:
      return mpFail(`ext value (type byte 0x${c.toString(16)}) at body offset ${DP - 1 - DS}: not in the data model`);
    default:                                        // 0xc1: never used
      return mpFail(`invalid type byte 0x${c.toString(16)} at body offset ${DP - 1 - DS}`);
  }
}

/**
 * The frame object held in buf[start, end): exactly one map or array.
 * Throws MsgpackError.
 */
function decodeMsgpackFrame(buf, start, end) {
  if (start === end) throw new MsgpackError('empty frame (length 0)');
  const c = buf[start];
  if (!((c >= 0x80 && c <= 0x9f) || (c >= 0xdc && c <= 0xdf))) {
    throw new MsgpackError(`the frame's object is not a map or an array (type byte 0x${c.toString(16)})`);
  }
  return decodeMsgpack(buf, start, end);
}

/** Exactly one value from buf[start, end) (whole buffer by default). Throws MsgpackError. */
function decodeMsgpack(buf, start = 0, end = buf.length) {
  D = buf; DS = start; DP = start; DE = end;
  try {
    if (start === end) mpFail('no value (0 bytes)');
    const v = mpRead();
    if (DP !== DE) mpFail(`${DE - DP} trailing bytes after the object`);
    return v;
  } catch (e) {
    if (e instanceof RangeError && !(e instanceof MsgpackError)) throw new MsgpackError(`nesting too deep (${e.message})`);
    throw e;
  } finally {
    D = null;
  }
}

/**
 * Length-prefixed frame reader (spec §9.6): push() chunks split anywhere;
 * onFrame(buf, start, end) gets each body (a view: valid during the call only),
 * onTooLarge(length) a length over the limit, after which the reader stops.
 */
class MsgpackFrameReader {
  constructor(maxFrame, onFrame, onTooLarge) {
    this.max = maxFrame;
    this.onFrame = onFrame;
    this.onTooLarge = onTooLarge;
    this.hdr = Buffer.alloc(4);
    this.hlen = 0;        // header bytes collected (split header)
    this.body = null;     // body being collected (split body)
    this.fill = 0;
    this.dead = false;
  }

  /** Inside a frame (an EOF now would cut it)? */
  midFrame() { return this.hlen > 0 || this.body !== null; }

  _start(len) {
    if (len > this.max) {
      this.dead = true;
      this.onTooLarge(len);
      return false;
    }
    return true;
  }

  push(chunk) {
    const n = chunk.length;
    let i = 0;
    while (i < n && !this.dead) {
      if (this.body !== null) {
        const take = Math.min(this.body.length - this.fill, n - i);
        chunk.copy(this.body, this.fill, i, i + take);
        this.fill += take;
        i += take;
        if (this.fill === this.body.length) {
          const body = this.body;
          this.body = null;
          this.onFrame(body, 0, body.length);
        }
      } else if (this.hlen === 0 && n - i >= 4) {
        const len = chunk.readUInt32BE(i);
        if (!this._start(len)) return;
        if (n - i - 4 >= len) {          // whole frame in this chunk: no copy
          i += 4 + len;
          this.onFrame(chunk, i - len, i);
        } else {
          this.body = Buffer.allocUnsafe(len);
          this.fill = 0;
          i += 4;
        }
      } else {
        while (this.hlen < 4 && i < n) this.hdr[this.hlen++] = chunk[i++];
        if (this.hlen === 4) {
          this.hlen = 0;
          const len = this.hdr.readUInt32BE(0);
          if (!this._start(len)) return;
          if (len === 0) this.onFrame(this.hdr, 0, 0);
          else { this.body = Buffer.allocUnsafe(len); this.fill = 0; }
        }
      }
    }
  }
}

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
  msgpack: false,     // extension msgpack accepted (spec §9.6): frames go to the slab EB
  emits: [],          // the output batch being filled
  acks: [],
  fails: [],
  bsize: 0,

  send(obj) {
    if (this.msgpack) {
      if (this.bsize > 0) this.closeBatch();   // §9.5: keep the order of calls
      mpFrame(obj);
      if (!this.scheduled) {
        this.scheduled = true;
        setImmediate(() => this.flush());
      }
      return;
    }
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
    if (this.msgpack) mpFrame(frame);
    else this.buf.push(JSON.stringify(frame) + '\nend\n');
  },

  sendPid(pid, extensions) {
    const reply = { pid };
    if (extensions && extensions.length > 0) reply.extensions = extensions;
    this.batching = !!extensions && extensions.includes('batch');
    this.buf.push(JSON.stringify(reply) + '\nend\n');   // always JSON (§9.6)
    if (!!extensions && extensions.includes('msgpack')) {
      this.msgpack = true;
      // Frames made before the reply were kept as JSON text: re-encode them.
      for (const t of this.early) mpFrame(JSON.parse(t.slice(0, -5)));
    } else {
      for (const t of this.early) this.buf.push(t);
    }
    this.early = [];
    this.ready = true;
    this.flush();
  },

  pending: 0,        // writes handed to stdout and not yet completed
  waiters: [],       // callbacks to run once everything has been written

  flush() {
    this.scheduled = false;
    if (this.bsize > 0) this.closeBatch();
    if (this.buf.length > 0) {
      const data = this.buf.length === 1 ? this.buf[0] : this.buf.join('');
      this.buf = [];
      this.write(data);
    }
    if (EO > ES) {
      // msgpack frames: hand over a view of the slab; it is never reused
      // until every write has completed (written() below).
      const data = EB.subarray(ES, EO);
      ES = EO;
      this.write(data);
    }
  },

  write(data) {
    this.pending++;
    try {
      rawWrite(data, 'utf8', () => this.written());
    } catch (e) {
      this.written();
    }
  },

  written() {
    this.pending--;
    if (this.pending === 0 && ES === EO) { ES = 0; EO = 0; }   // the slab is free again
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
   * instance, to speak the standard protocol only (`['batch']`: no msgpack).
   */
  static extensions = ['batch', 'msgpack'];

  constructor() {
    this.conf = null;
    this.context = null;
    this.pidDir = null;
    this._queue = [];           // frames waiting to be handled (not task ids)
    this._qhead = 0;
    this._busy = false;         // an async handler is in progress
    this._pendingIds = [];      // FIFO of resolvers for emits awaiting task ids
    this._handshaken = false;
    this._extensions = [];      // accepted at the handshake
    this._stateAccepted = false;   // extension state accepted (spec §9.7; StatefulBolt only)
    this._offered = [];            // the host's offer (spec §9.1)
    this._mpReader = null;      // input after a msgpack switch-over (§9.6)
    this._halfway = 0;          // frames to handle before the halfway flush of a burst
    this._maxFrame = MAX_FRAME_BYTES;   // §1.3: the default until the handshake's conf
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

  /**
   * The extensions this component accepts: the instance's, else its class's;
   * `state` only for a StatefulBolt (spec §9.7).
   */
  _acceptedExtensions() {
    const mine = this.extensions !== undefined ? this.extensions : this.constructor.extensions;
    const list = Array.isArray(mine) ? mine.map(String) : [];
    return this._keepsState() ? list : list.filter((e) => e !== 'state');
  }

  _keepsState() { return false; }

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
    // Spec §1.3: never buffer more than the limit waiting for a terminator.
    // Counted in UTF-16 units (at most the UTF-8 bytes); bytes are counted
    // only when the units could be over the limit.
    let frameUnits = 0;   // units of the lines of the frame being read, with their breaks
    const tooLarge = (pending) => {
      if (frameUnits + pending.length <= this._maxFrame / 3) return false;
      const bytes = lines.reduce((n, l) => n + Buffer.byteLength(l) + 1, 0) + Buffer.byteLength(pending);
      if (bytes <= this._maxFrame) return false;
      this._protocolFatal(`FrameTooLarge: a frame of at least ${bytes} bytes exceeds the ${this._maxFrame}-byte ` +
                          'limit (multilang.max.frame.bytes)');
      return true;
    };
    const feed = (text) => {
      if (!text || this._exiting) return;
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
          frameUnits = 0;
          this._onFrame(frame);
          if (this._exiting) return;
        } else {
          lines.push(line);
          frameUnits += line.length + 1;
          if (frameUnits > this._maxFrame / 3 && tooLarge('')) return;
        }
      }
      partial = start === 0 ? data : data.slice(start);
      data = null;
      if (tooLarge(partial)) partial = '';
    };

    // msgpack (§9.6): the reader switches right after the handshake's "end"
    // line, so until then input is fed one line at a time (as bytes).
    let dropLF = false;   // the handshake ended with "end\r": a "\n" next is its tail
    const feedMsgpack = (chunk) => {
      if (dropLF && chunk.length > 0) {
        dropLF = false;
        if (chunk[0] === 10) chunk = chunk.subarray(1);
      }
      this._mpReader.push(chunk);
    };
    input.on('data', (chunk) => {
      if (this._mpReader !== null) { feedMsgpack(chunk); return; }
      if (this._handshaken) { this._countBurst(chunk); feed(decoder.write(chunk)); return; }
      const n = chunk.length;
      let i = 0;
      while (i < n) {
        let j = i;
        while (j < n && chunk[j] !== 10 && chunk[j] !== 13) j++;
        if (j < n) j++;
        feed(decoder.write(j - i === n ? chunk : chunk.subarray(i, j)));
        i = j;
        if (this._handshaken) {
          if (this._mpReader !== null) {
            dropLF = skipLF;
            skipLF = false;
            if (i < n) feedMsgpack(chunk.subarray(i));
          } else if (i < n) {
            feed(decoder.write(chunk.subarray(i)));
          }
          return;
        }
      }
    });
    input.on('end', () => {
      if (this._mpReader !== null) {
        if (this._mpReader.midFrame() && !this._mpReader.dead) {
          this._protocolFatal('stream ended in the middle of a frame');
          return;
        }
      } else {
        feed(decoder.end());
        if (partial === 'end' || partial === 'end\r') { partial = ''; this._onFrame(lines.join('\n')); }
      }
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
      // §8.1: the connection is unusable after a protocol error. Stop, as
      // the Python and Ruby libraries do: the host restarts the process and
      // replays its tuples at once, instead of a skipped tuple timing out.
      const shown = text.length > 200 ? text.slice(0, 200) + '...' : text;
      this._protocolFatal(`cannot parse frame from host: ${e.message}: ${JSON.stringify(shown)}`);
      return;
    }
    if (!this._handshaken) {
      this._handshaken = true;
      this._negotiate(msg);
      this._enqueue({ handshake: msg });
      return;
    }
    this._onMessage(msg);
    if (this._halfway > 0 && --this._halfway === 0) out.flush();   // see _countBurst
  }

  /**
   * A chunk of many frames is a burst. Its first half is answered (flushed)
   * before the second half is handled: a host keeps at most
   * topology.shellbolt.max.pending tuples unacked (spec §5.3), and with the
   * first half's acks it sends more while we work, instead of host and
   * component taking turns. One more write per burst.
   */
  _countBurst(chunk) {
    let n = 0;
    for (let i = chunk.indexOf(FRAME_END_BYTES); i !== -1; i = chunk.indexOf(FRAME_END_BYTES, i + 5)) n++;
    this._halfway = n >= HALFWAY_FLUSH_MIN ? n >> 1 : 0;
  }

  /** §9.1, §9.2: accept the offered extensions this component knows. */
  _negotiate(msg) {
    const conf = (msg && msg.conf) || {};
    // §9.1: the offer is the handshake's own key, which Storm's host never
    // writes; a conf key (a topology conf Storm passes through) is not one.
    const offered = msg && Array.isArray(msg.extensions) ? msg.extensions : [];
    this._offered = offered;
    this._extensions = [...new Set(this._acceptedExtensions())].filter((e) => offered.includes(e));
    this._stateAccepted = this._extensions.includes('state');
    const limit = conf['multilang.max.frame.bytes'];
    this._maxFrame = Number.isSafeInteger(limit) && limit > 0 ? limit : MAX_FRAME_BYTES;   // §1.3
    if (this._extensions.includes('msgpack')) {
      const max = this._maxFrame;
      this._mpReader = new MsgpackFrameReader(max,
        (buf, start, end) => this._onMsgpackFrame(buf, start, end),
        (len) => this._protocolFatal(
          `FrameTooLarge: frame length ${len} exceeds the ${max}-byte limit (multilang.max.frame.bytes)`));
    }
  }

  _onMsgpackFrame(buf, start, end) {
    let msg;
    try {
      msg = decodeMsgpackFrame(buf, start, end);
    } catch (e) {
      if (!(e instanceof MsgpackError)) throw e;
      // §8.1: as for a frame that is not JSON, stop.
      const shown = buf.subarray(start, Math.min(end, start + 200)).toString('hex') + (end - start > 200 ? '...' : '');
      this._protocolFatal(`cannot decode msgpack frame from host: ${e.message} (${end - start} bytes: ${shown})`);
      return;
    }
    this._onMessage(msg);
  }

  /**
   * A protocol error after which the input cannot be read any further (a
   * length over the limit, end of stream inside a frame): report it (stderr
   * and an error frame), then exit with status 1.
   */
  _protocolFatal(what) {
    if (this._mpReader) this._mpReader.dead = true;
    process.stderr.write(`multilang: protocol error: ${what}\n`);
    if (out.ready) this.reportError(`protocol error: ${what}`);
    this._exiting = true;
    process.stdin.pause();
    out.drain(() => process.exit(1));
    setTimeout(() => process.exit(1), 2000).unref();
  }

  _onMessage(msg) {
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
    const accepted = this._extensions;   // chosen when the frame arrived (_negotiate)
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
      if (msg !== null && typeof msg === 'object' && msg.command === 'state') {
        this._protocolFatal('state.negotiated: a state frame on a connection that did not accept the state ' +
                            `extension (spec §9.7): ${frameText(msg)}`);
        return undefined;
      }
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
// Stateful bolts (extension state, spec §9.7)
// ---------------------------------------------------------------------------

const ABSENT = Symbol('multilang.absent');   // an undo entry for a key that did not exist
const STATE_ACTIONS = ['init', 'prepare', 'commit', 'rollback'];
const STATE_CHUNK_KEYS = 1000;               // keys per prepared frame at most
const STATE_CHUNK_BYTES = 1 << 20;           // ... and about this many bytes

function showValue(v) {
  if (typeof v === 'symbol' || typeof v === 'bigint') return `${typeof v} ${String(v)}`;
  if (typeof v === 'function') return 'a function';
  if (v === undefined) return 'undefined';
  try {
    const text = JSON.stringify(v);
    return `${typeof v} ${text === undefined ? String(v) : text.slice(0, 100)}`;
  } catch (_) {
    return `${typeof v} ${String(v)}`;
  }
}

function setMember(obj, k, v) {
  // As JSON.parse: "__proto__" is an ordinary own member, not the prototype.
  if (k === '__proto__') Object.defineProperty(obj, k, { value: v, writable: true, enumerable: true, configurable: true });
  else obj[k] = v;
}

function checkKey(key) {
  if (typeof key !== 'string') throw new TypeError(`state keys must be strings, got ${showValue(key)}`);
}

/** A deep copy of a JSON value (as JSON.stringify would see it); a TypeError naming the key otherwise. */
function stateValue(v, key) {
  switch (typeof v) {
    case 'string':
    case 'boolean':
      return v;
    case 'number':
      if (Number.isFinite(v)) return v;
      throw new TypeError(`state value for key ${JSON.stringify(key)}: ${v} is not a JSON number`);
    case 'object': {
      if (v === null) return null;
      if (Array.isArray(v)) {
        const a = new Array(v.length);
        for (let i = 0; i < v.length; i++) a[i] = stateValue(v[i], key);
        return a;
      }
      if (typeof v.toJSON === 'function') return stateValue(v.toJSON(), key);
      if (v instanceof Number || v instanceof String || v instanceof Boolean) return stateValue(v.valueOf(), key);
      if (v instanceof Map || v instanceof Set) break;
      const o = {};
      for (const k of Object.keys(v)) {
        if (v[k] !== undefined) setMember(o, k, stateValue(v[k], key));   // JSON leaves undefined members out
      }
      return o;
    }
    default:
      break;
  }
  const what = v instanceof Map || v instanceof Set ? `a ${v.constructor.name}` : showValue(v);
  throw new TypeError(`state value for key ${JSON.stringify(key)}: ${what} is not a JSON value`);
}

/** A deep copy of a value already checked by stateValue. */
function copyValue(v) {
  if (v === null || typeof v !== 'object') return v;
  if (Array.isArray(v)) return v.map(copyValue);
  const o = {};
  for (const k of Object.keys(v)) setMember(o, k, copyValue(v[k]));
  return o;
}

/**
 * The key-value state of a StatefulBolt (spec §9.7; Storm's KeyValueState).
 * Keys are strings; values JSON values (a TypeError naming the key
 * otherwise). put() stores a copy and get() returns one, so change a value
 * by putting it back: a change made in place is neither checkpointed nor
 * rolled back.
 */
class KeyValueState {
  constructor() {
    this._map = new Map();
    this._dirty = new Set();      // keys put or deleted since the last init, prepared or rollback
    this._undo = new Map();       // key -> its value as of the last init or commit (or ABSENT), for keys changed since
    this._prepared = new Map();   // key -> the value (or ABSENT) it was prepared with, since the last commit or rollback
  }

  get(key, dflt) {
    checkKey(key);
    return this._map.has(key) ? copyValue(this._map.get(key)) : dflt;
  }

  put(key, value) {
    checkKey(key);
    const v = stateValue(value, key);   // throws before anything changes
    this._changing(key);
    this._map.set(key, v);
  }

  /** Remove the key; returns its value (undefined if there was none). */
  delete(key) {
    checkKey(key);
    this._changing(key);
    const old = this._map.get(key);
    this._map.delete(key);
    return copyValue(old);
  }

  has(key) {
    checkKey(key);
    return this._map.has(key);
  }

  get size() { return this._map.size; }

  keys() { return this._map.keys(); }

  /** [key, value] pairs (values are copies). */
  * entries() {
    for (const [k, v] of this._map) yield [k, copyValue(v)];
  }

  [Symbol.iterator]() { return this.entries(); }

  _changing(key) {
    if (!this._undo.has(key)) this._undo.set(key, this._map.has(key) ? this._map.get(key) : ABSENT);
    this._dirty.add(key);
  }

  // ---- for StatefulBolt ------------------------------------------------------

  /** init: the state becomes obj (as read from the host, adopted). */
  _load(obj) {
    this._map = new Map(Object.entries(obj));
    this._dirty = new Set();
    this._undo = new Map();
    this._prepared = new Map();
  }

  /** prepare: the changes since the last init, prepared or rollback, as [[key, value]...], [key...]. */
  _takeChanges() {
    const put = [];
    const del = [];
    for (const k of this._dirty) {
      if (this._map.has(k)) {
        const v = this._map.get(k);
        put.push([k, v]);
        this._prepared.set(k, v);
      } else {
        del.push(k);
        this._prepared.set(k, ABSENT);
      }
    }
    this._dirty = new Set();
    return [put, del];
  }

  /** commit: what was prepared is durable; a key changed since rolls back to its prepared value. */
  _commit() {
    const undo = new Map();
    for (const k of this._dirty) undo.set(k, this._prepared.has(k) ? this._prepared.get(k) : this._undo.get(k));
    this._undo = undo;
    this._prepared = new Map();
  }

  /** rollback: back to the state as of the last init or commit. */
  _rollback() {
    for (const [k, v] of this._undo) {
      if (v === ABSENT) this._map.delete(k);
      else this._map.set(k, v);
    }
    this._dirty = new Set();
    this._undo = new Map();
    this._prepared = new Map();
  }
}

function frameText(msg) {
  let text;
  try { text = JSON.stringify(msg); } catch (_) { text = String(msg); }
  if (text === undefined) text = String(msg);
  return text.length > 200 ? text.slice(0, 200) + '...' : text;
}

function frameKind(msg) {
  if (Array.isArray(msg)) return 'a task-id list';
  if (msg instanceof Tuple) return msg.isHeartbeat() ? 'a heartbeat' : 'a tuple';
  if (msg !== null && typeof msg === 'object' && msg.command === 'state') {
    return `a state frame (action ${JSON.stringify(msg.action === undefined ? null : msg.action)})`;
  }
  if (msg !== null && typeof msg === 'object' && msg.stream === '__heartbeat') return 'a heartbeat';
  return 'a tuple';
}

/** Why a host state frame is invalid (spec §9.7 state.invalid), or null. */
function stateFrameError(msg) {
  const { action, txid } = msg;
  if (!STATE_ACTIONS.includes(action)) return `unknown action ${JSON.stringify(action === undefined ? null : action)}`;
  const nullable = action === 'init' || action === 'rollback';
  if (!((Number.isSafeInteger(txid) && txid >= 1) || (nullable && (txid === null || txid === undefined)))) {
    return `txid ${JSON.stringify(txid === undefined ? null : txid)} (an integer >= 1${nullable ? ', or null' : ''})`;
  }
  if (action === 'init' && (msg.state === null || typeof msg.state !== 'object' || Array.isArray(msg.state))) {
    return 'state is not an object';
  }
  if (Object.prototype.hasOwnProperty.call(msg, 'more') && typeof msg.more !== 'boolean') return 'more is not a boolean';
  return null;
}

/**
 * A BasicBolt with a key-value state, `this.state` (spec §9.7; Storm's
 * IStatefulBolt). Under a host that offers the `state` extension
 * (multilang-bridge's) the host keeps it durable: it gives it back at every
 * process start, collects the changes at each checkpoint and commits or rolls
 * them back. Under a host that does not (Storm's ShellBolt) the state lives in
 * memory, starting empty, as with Storm's default InMemoryKeyValueStateProvider.
 *
 * Hooks (no-ops by default; may return a promise): initState(state), once per
 * process start, after initialize and the host's whole init and before the
 * first tuple; prePrepare(txid), preCommit(txid), preRollback(). A hook that
 * throws stops the process (status 1): the host rolls back and restarts it.
 * `static extensions` defaults to ['batch', 'msgpack', 'state']; a list
 * without 'state' keeps the state in memory only.
 */
class StatefulBolt extends BasicBolt {
  static extensions = ['batch', 'msgpack', 'state'];

  constructor() {
    super();
    this.state = new KeyValueState();
    this._initDone = false;
    this._initState = null;       // the init chunks so far (merged)
    this._initTxid = null;
    this._lastPrepared = null;    // txid of the last answered prepare not yet committed or rolled back
  }

  /** Hook: the state is ready (once per process start, before the first tuple). */
  initState(state) { } // eslint-disable-line no-unused-vars

  /** Hook: a checkpoint is about to collect the changes (put last changes here). */
  prePrepare(txid) { } // eslint-disable-line no-unused-vars

  /** Hook: the changes prepared under txid are about to be durable. */
  preCommit(txid) { } // eslint-disable-line no-unused-vars

  /** Hook: the state is about to go back to the last commit. */
  preRollback() { }

  _keepsState() { return true; }

  _startHook(conf, context) {
    const r = super._startHook(conf, context);
    if (this._stateAccepted) return r;   // initState follows the host's init
    if (this._offered.includes('state')) {
      process.stderr.write(`multilang: ${this.constructor.name} declined the offered state extension ` +
                           `(extensions ${JSON.stringify(this._acceptedExtensions())}); its state is kept in memory only\n`);
    }
    this._initDone = true;
    const init = () => this._stateHook(() => this.initState(this.state));
    return isThenable(r) ? Promise.resolve(r).then(init) : init();
  }

  _dispatch(msg) {
    if (!(msg instanceof Tuple) && msg !== null && typeof msg === 'object' && msg.command === 'state') {
      return this._onState(msg);
    }
    if (!this._initDone) {
      this._protocolFatal(`state.order: ${frameKind(msg)} before the whole state init (spec §9.7): ${frameText(msg)}`);
      return undefined;
    }
    return super._dispatch(msg);
  }

  _onState(msg) {
    if (!this._stateAccepted) return super._dispatch(msg);   // state.negotiated
    const bad = stateFrameError(msg);
    if (bad !== null) {
      this._protocolFatal(`state.invalid: ${bad} (spec §9.7): ${frameText(msg)}`);
      return undefined;
    }
    const { action, txid } = msg;
    if (!this._initDone) {
      if (action !== 'init') {
        this._protocolFatal(`state.order: ${frameKind(msg)} before the whole state init (spec §9.7): ${frameText(msg)}`);
        return undefined;
      }
      if (this._initState === null) {
        this._initState = msg.state;
        this._initTxid = txid === undefined ? null : txid;
      } else {
        if ((txid === undefined ? null : txid) !== this._initTxid) {
          this._protocolFatal(`state.invalid: init chunks with txids ${this._initTxid} and ${txid} (spec §9.7): ` +
                              frameText(msg));
          return undefined;
        }
        for (const k of Object.keys(msg.state)) {
          if (Object.prototype.hasOwnProperty.call(this._initState, k)) {
            this._protocolFatal(`state.invalid: key ${JSON.stringify(k)} in two init chunks (spec §9.7): ${frameText(msg)}`);
            return undefined;
          }
          setMember(this._initState, k, msg.state[k]);
        }
      }
      if (msg.more === true) return undefined;
      this.state._load(this._initState);
      this._initState = null;
      this._initDone = true;
      return this._stateHook(() => this.initState(this.state));
    }
    switch (action) {
      case 'init':
        this._protocolFatal(`state.order: a second init (spec §9.7): ${frameText(msg)}`);
        return undefined;
      case 'prepare':
        return this._stateHook(() => this.prePrepare(txid), () => {
          const [put, del] = this.state._takeChanges();
          this._sendPrepared(txid, put, del);
          this._lastPrepared = txid;
        });
      case 'commit':
        if (this._lastPrepared === null || txid !== this._lastPrepared) {
          this._protocolFatal(`state.order: commit ${txid} does not name the last answered prepare ` +
                              `(${this._lastPrepared === null ? 'none' : this._lastPrepared}) (spec §9.7)`);
          return undefined;
        }
        return this._stateHook(() => this.preCommit(txid), () => {
          this.state._commit();
          this._lastPrepared = null;
        });
      default:   // rollback
        return this._stateHook(() => this.preRollback(), () => {
          this.state._rollback();
          this._lastPrepared = null;
        });
    }
  }

  /** Run a state hook, then `after`; an exception in either stops the process. */
  _stateHook(hook, after) {
    const die = (e) => {
      const text = errorText(e);
      process.stderr.write(`multilang: ${text}\n`);
      this.reportError(text);
      this._exiting = true;
      out.drain(() => process.exit(1));
      setTimeout(() => process.exit(1), 2000).unref();
    };
    return settle(hook, () => {
      if (after === undefined) return;
      try { after(); } catch (e) { die(e); }
    }, die);
  }

  /**
   * The `prepared` answer, in chunks of at most STATE_CHUNK_KEYS keys and
   * about STATE_CHUNK_BYTES bytes ("more": true on all but the last). A
   * standard frame: out.send closes an open output batch first (§9.5).
   */
  _sendPrepared(txid, put, del) {
    const max = this._maxFrame;
    const limit = Math.min(STATE_CHUNK_BYTES, Math.floor(max / 2));
    let chunkPut = {};
    let chunkDel = [];
    let n = 0;
    let bytes = 0;
    const send = (more) => {
      const frame = { command: 'state', action: 'prepared', txid, put: chunkPut, delete: chunkDel };
      if (more) frame.more = true;
      out.send(frame);
    };
    const add = (key, size) => {
      if (size > max - 200) {
        throw new RangeError(`state value for key ${JSON.stringify(key)} takes ${size} bytes, more than a frame ` +
                             `may hold (${max} bytes, multilang.max.frame.bytes)`);
      }
      if (n > 0 && (n >= STATE_CHUNK_KEYS || bytes + size > limit)) {
        send(true);
        chunkPut = {};
        chunkDel = [];
        n = 0;
        bytes = 0;
      }
      n++;
      bytes += size;
    };
    for (const [k, v] of put) {
      const vsize = v === null || typeof v === 'number' || typeof v === 'boolean' ? 24 : Buffer.byteLength(JSON.stringify(v));
      add(k, Buffer.byteLength(k) + vsize + 4);
      setMember(chunkPut, k, v);
    }
    for (const k of del) {
      add(k, Buffer.byteLength(k) + 3);
      chunkDel.push(k);
    }
    send(false);
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
  encodeMsgpack,
  decodeMsgpack,
  MsgpackError,
  Tuple,
  Component,
  Bolt,
  BasicBolt,
  StatefulBolt,
  KeyValueState,
  Spout,
  LOG_LEVELS,
  installStdoutGuard,
  restoreStdout,
};
