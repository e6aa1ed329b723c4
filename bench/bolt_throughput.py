#!/usr/bin/env python
"""Bolt throughput: our component library vs pystorm vs a hand-written ceiling.

    python bench/bolt_throughput.py [--tuples N] [--repeat R] [--profile] [--batch B]

One plain-bytes driver runs every component as a child process, as Storm's
ShellBolt would: it writes the handshake, waits for the pid reply, then (clock
starts) a thread writes N pre-encoded tuple frames in 256 KiB chunks while the
main thread reads stdout in 1 MiB reads and counts ``\\nend\\n`` terminators and
ack frames until it has seen N acks (clock stops; also waits for the writer).
Then stdin is closed and the child reaped. Heartbeats are not sent.

Workloads (same frames for every component of a workload):
  echo   tuple ["<word>", <int>]          -> one anchored emit + ack   (N=150,000)
  split  tuple ["<5-word sentence>"]      -> one anchored emit per word + ack (N/4)
pystorm runs the first N tuples; ours, the hand-written bolt and the driver
ceiling, being ~5-60x faster, run the first N*4 tuples of the same sequence
(--ceiling-scale) so each run lasts long enough to time (rates are per tuple).
Ours and the hand-written bolt, whose ratio is a target, get the same tuples:
on a shared machine a longer run is likelier to meet a slow spell, and
best-of-R would then favour the shorter one.

Components (bench/components/):
  ours      multilang.Bolt  (emit(values, anchors=[tup]) then ack(tup))
  pystorm   pystorm.Bolt    (emit(..., anchors=[tup], need_task_ids=False), auto_ack)
  hand      hand-written orjson loop, one os.write per read burst (the ceiling)
  driver    `cat` of a pre-encoded reply stream (while stdin goes to /dev/null):
            what the driver itself can sustain.

The warm-up run of every component is fully verified (every output frame is
parsed: the acks are exactly the input ids in order, every emit carries the
right values, anchors == [id] and need_task_ids == false); the timed runs check
exact ack/emit counts. Best of R timed runs is reported; components are
interleaved round-robin so background load hits them alike.

``--batch B`` then also times the batched fast path (spec §9.5): the driver
offers ``"extensions": ["batch"]`` in the handshake (§9.1), requires the
bolt to accept it, and sends ``{"tuples": [...]}`` frames of B tuples; acks are
counted from the raw bytes of the ``{"command":"batch",...,"acks":[...]}``
frames (the commas between ``"acks":[`` and the next ``]``; tuple ids are
digit strings), emits by their ``],["`` anchor separators (every emit here is
anchored to one id), never by parsing frames. The warm-up run is again parsed
in full and proves the counts. Rows: our echo/split bolt batched, and the
driver ceiling replaying a batched reply stream. (bench/run_all.py uses the
same machinery for every language.)

msgpack mode (spec §9.6; ``Workload.msgpack()``, used by bench/run_all.py):
``wl.msgpack()`` offers ``["msgpack"]`` and sends the same tuples as
length-prefixed msgpack maps; ``wl.batched(B).msgpack()`` offers
``["batch", "msgpack"]`` and sends msgpack ``{"tuples": [...]}`` batches. The
pid reply (JSON) must accept every offered extension, else the run fails
("the msgpack extension was offered but not accepted"). Timed runs walk the
4-byte length prefixes to the last complete frame and count standard frames
by the msgpack bytes of ``"command"`` followed by ``"ack"``/``"emit"``; in a
``"command": "batch"`` frame the element counts are read from the array
headers after the ``"acks"``/``"emits"`` keys. No frame is parsed. The
warm-up run is parsed in full with the library's strict decoder (framing,
data model; batch frames only if batch was offered) and checked as above,
and the cheap counts must equal the parse. ``reply_stream()`` gives the
matching msgpack stream for the ``cat`` ceiling.

``--profile`` then runs our echo bolt under cProfile (``BENCH_PROFILE`` env var
read by bench/components/_bench_common.py) and prints the top functions, and
times our library's per-tuple stages in-process (no profiler overhead).
"""

from __future__ import annotations

import argparse
import copy
import os
import pstats
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgpack
import orjson

from multilang.codec import msgpack_frame, msgpack_loads
from multilang.errors import MultilangError
from multilang.framing import LengthPrefixedReader

HERE = Path(__file__).resolve().parent
COMPONENTS = HERE / "components"
TERM = b"\nend\n"
WRITE_CHUNK = 256 * 1024
READ_SIZE = 1 << 20
# pystorm (simplejson) writes '"command": "ack"', orjson '"command":"ack"'.
# The verified warm-up run proves these counts equal a full parse.
ACK_FORMS = (b'"command":"ack"', b'"command": "ack"')
EMIT_FORMS = (b'"command":"emit"', b'"command": "emit"')
ACK_RE = re.compile(rb'"command"\s*:\s*"ack"')


class BenchError(RuntimeError):
    pass


# --- workload ------------------------------------------------------------------


def _vocabulary(rng: random.Random, n: int = 2000) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(n)]


def _ids(rng: random.Random, n: int) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < n:
        s = str(rng.getrandbits(64) - (1 << 63))  # random signed 64-bit (§3)
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


class Workload:
    """Pre-encoded handshake + N tuple frames, and what the bolt must answer."""

    def __init__(self, kind: str, n: int, pid_dir: str, seed: int = 42) -> None:
        rng = random.Random(seed)
        vocab = _vocabulary(rng)
        self.kind = kind
        self.n = n
        self.batch = 0  # tuples per host frame; 0 = standard protocol (see batched())
        self.mp = False  # extension msgpack (§9.6): frames after the pid reply (see msgpack())
        self.ids = _ids(rng, n)
        if kind == "echo":
            fields = ["word", "count"]
            self.values = [[rng.choice(vocab), rng.randint(0, 9999)] for _ in range(n)]
            self.emits_per_tuple = [1] * n
        else:
            fields = ["sentence"]
            self.values = [[" ".join(rng.choice(vocab) for _ in range(5))] for _ in range(n)]
            self.emits_per_tuple = [5] * n
        self.n_emits = sum(self.emits_per_tuple)
        # The drivers count frames by these words' bytes (JSON and msgpack),
        # so no tuple value may be one of them.
        clash = set(vocab) & {"ack", "acks", "emit", "emits", "batch", "command", "fail", "fails", "tuples"}
        if clash:
            raise BenchError(f"vocabulary holds protocol words {sorted(clash)}: pick another seed")
        context = {
            "task->component": {"-1": "__system", "1": "__acker", "2": "spout", "3": "bolt", "4": "sink"},
            "taskid": 3,
            "componentid": "bolt",
            "streams": ["default"],
            "stream->outputfields": {"default": ["word", "count"] if kind == "echo" else ["word"]},
            "stream->target->grouping": {"default": {"sink": {"type": "SHUFFLE"}}},
            "source->stream->grouping": {"spout": {"default": {"type": "SHUFFLE"}}},
            "source->stream->fields": {"spout": {"default": fields}},
        }
        conf = {"topology.name": "bench", "topology.debug": False, "topology.message.timeout.secs": 30}
        self._hs = {"pidDir": pid_dir, "conf": conf, "context": context}
        self.handshake = orjson.dumps(self._hs) + TERM
        frames = [
            orjson.dumps({"id": tid, "comp": "spout", "stream": "default", "task": 2, "tuple": vals})
            for tid, vals in zip(self.ids, self.values)
        ]
        ends = []
        pos = 0
        for fr in frames:
            pos += len(fr) + len(TERM)
            ends.append(pos)
        self._ends = ends  # byte offset just past frame i
        frames.append(b"")
        self.blob = TERM.join(frames)

    @property
    def extensions(self) -> list[str]:
        """What the handshake offers (and the pid reply must accept)."""
        return (["batch"] if self.batch else []) + (["msgpack"] if self.mp else [])

    @property
    def mode(self) -> str:
        parts = (["msgpack"] if self.mp else []) + ([f"batch {self.batch}"] if self.batch else [])
        return "+".join(parts) or "standard"

    def _offer(self) -> None:
        hs = copy.deepcopy(self._hs)
        hs["extensions"] = self.extensions
        self._hs = hs
        self.handshake = orjson.dumps(hs) + TERM

    def batched(self, size: int) -> "Workload":
        """The same tuples for the ``batch`` extension (spec §9.5): the
        handshake offers it, and the blob is ``{"tuples": [...]}`` frames of
        ``size`` tuples each (msgpack-encoded if this workload is msgpack)."""
        sub = copy.copy(self)
        sub.batch = size
        sub._offer()
        sub._ends = None
        sub.blob = (_batch_blob_mp if self.mp else _batch_blob)(self.ids, self.values, size)
        return sub

    def msgpack(self) -> "Workload":
        """The same tuples for the ``msgpack`` extension (spec §9.6): the
        handshake offers ``["msgpack"]`` (``["batch", "msgpack"]`` if this
        workload is batched), and the blob is length-prefixed msgpack frames:
        standard tuple maps, or ``{"tuples": [...]}`` batches."""
        sub = copy.copy(self)
        sub.mp = True
        sub._offer()
        probe = {"id": self.ids[0], "comp": "spout", "stream": "default", "task": 2, "tuple": self.values[0]}
        if _mp_frame(probe) != msgpack_frame(probe):  # the fast encoder is the library's encoding
            raise BenchError("_mp_frame differs from multilang.codec.msgpack_frame")
        if self.batch:
            sub._ends = None
            sub.blob = _batch_blob_mp(self.ids, self.values, self.batch)
            return sub
        frames = [_mp_frame({"id": tid, "comp": "spout", "stream": "default", "task": 2, "tuple": vals})
                  for tid, vals in zip(self.ids, self.values)]
        ends = []
        pos = 0
        for fr in frames:
            pos += len(fr)
            ends.append(pos)
        sub._ends = ends
        sub.blob = b"".join(frames)
        return sub

    def take(self, k: int) -> "Workload":
        """The first ``k`` tuples of this workload (same ids, same values)."""
        if k >= self.n:
            return self
        sub = copy.copy(self)
        sub.n = k
        sub.ids = self.ids[:k]
        sub.values = self.values[:k]
        sub.emits_per_tuple = self.emits_per_tuple[:k]
        sub.n_emits = sum(sub.emits_per_tuple)
        if self.batch:
            sub.blob = (_batch_blob_mp if self.mp else _batch_blob)(sub.ids, sub.values, self.batch)
        else:
            sub._ends = self._ends[:k]
            sub.blob = self.blob[: self._ends[k - 1]]
        return sub

    def expected_emits(self, i: int) -> list[list]:
        if self.kind == "echo":
            return [self.values[i]]
        return [[w] for w in self.values[i][0].split()]

    def reply_stream(self) -> bytes:
        """What a correct bolt writes (hand-written's format), pid frame first."""
        if self.mp:
            return self._msgpack_reply_stream()
        if self.batch:
            return self._batched_reply_stream()
        out = [orjson.dumps({"pid": 1})]
        for i, tid in enumerate(self.ids):
            for vals in self.expected_emits(i):
                out.append(orjson.dumps({"command": "emit", "tuple": vals, "anchors": [tid], "need_task_ids": False}))
            out.append(orjson.dumps({"command": "ack", "id": tid}))
        out.append(b"")
        return TERM.join(out)

    def _batched_reply_stream(self) -> bytes:
        """What a correct batched bolt writes (our Python library's format:
        one output batch per input batch), pid frame first."""
        out = [orjson.dumps({"pid": 1, "extensions": ["batch"]})]
        size = self.batch
        for lo in range(0, self.n, size):
            emits = [[vals, [tid]] for i, tid in zip(range(lo, min(lo + size, self.n)), self.ids[lo : lo + size])
                     for vals in self.expected_emits(i)]
            out.append(orjson.dumps({"command": "batch", "emits": emits, "acks": self.ids[lo : lo + size]}))
        out.append(b"")
        return TERM.join(out)

    def _msgpack_reply_stream(self) -> bytes:
        """msgpack mode (§9.6): the JSON pid reply accepting the offer, then
        length-prefixed msgpack frames: emit + ack frames, or (batched) one
        output batch per input batch, as our Python library writes them."""
        out = [orjson.dumps({"pid": 1, "extensions": self.extensions}) + TERM]
        if self.batch:
            size = self.batch
            for lo in range(0, self.n, size):
                emits = [[vals, [self.ids[i]]] for i in range(lo, min(lo + size, self.n)) for vals in self.expected_emits(i)]
                out.append(_mp_frame({"command": "batch", "emits": emits, "acks": self.ids[lo : lo + size]}))
        else:
            for i, tid in enumerate(self.ids):
                for vals in self.expected_emits(i):
                    out.append(_mp_frame({"command": "emit", "tuple": vals, "anchors": [tid], "need_task_ids": False}))
                out.append(_mp_frame({"command": "ack", "id": tid}))
        return b"".join(out)

    def verify(self, output: bytes) -> None:
        """Parse every frame after the pid reply and check it exactly."""
        if self.mp:
            self._verify_msgpack(output)
            return
        if self.batch:
            self._verify_batched(output)
            return
        bodies = output.split(TERM)
        if bodies[-1].strip():
            raise BenchError(f"output ends with a partial frame: {bodies[-1][:200]!r}")
        i = 0  # input tuple index
        pending_emits: list[list] | None = None
        n_ack_re = len(ACK_RE.findall(output))
        acks = 0
        for body in bodies[:-1]:
            try:
                obj = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                raise BenchError(f"bad frame {body[:200]!r}: {exc}") from None
            cmd = obj.get("command") if type(obj) is dict else None
            if cmd in ("log", "sync", "metrics"):
                continue
            if i >= self.n:
                raise BenchError(f"frame after the last ack: {body[:200]!r}")
            tid = self.ids[i]
            if pending_emits is None:
                pending_emits = self.expected_emits(i)
            if cmd == "emit":
                if not pending_emits:
                    raise BenchError(f"tuple {i}: too many emits: {body[:200]!r}")
                want = pending_emits.pop(0)
                if list(obj.get("tuple", ())) != want or obj.get("anchors") != [tid] or obj.get("need_task_ids") is not False:
                    raise BenchError(f"tuple {i}: wrong emit {body[:200]!r}, wanted {want!r} anchored to {tid}")
            elif cmd == "ack":
                if obj.get("id") != tid or pending_emits:
                    raise BenchError(f"tuple {i}: wrong/early ack {body[:200]!r} (want id {tid}, {len(pending_emits)} emits missing)")
                acks += 1
                i += 1
                pending_emits = None
            else:
                raise BenchError(f"unexpected frame {body[:200]!r}")
        if acks != self.n or n_ack_re != self.n:
            raise BenchError(f"{acks} acks parsed, {n_ack_re} ack frames by regex; expected {self.n}")

    def _verify_batched(self, output: bytes) -> None:
        """Batch mode: parse every frame, expand output batches into the
        standard frames they stand for (emits, then acks, then fails, §9.5),
        check them as :meth:`verify` does, and check that the cheap byte
        counts of :func:`_count_batched` equal the parsed counts."""
        bodies = output.split(TERM)
        if bodies[-1].strip():
            raise BenchError(f"output ends with a partial frame: {bodies[-1][:200]!r}")
        events: list[tuple] = []  # ("emit", values, anchors) | ("ack", id)
        for body in bodies[:-1]:
            try:
                obj = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                raise BenchError(f"bad frame {body[:200]!r}: {exc}") from None
            self._frame_events(obj, events, batch_ok=True)
        self._check_events(events)
        _, a, e = _count_batched(output)
        n_want = self.n_emits
        if a != self.n or e != n_want:
            raise BenchError(f"byte counts {a} acks / {e} emits differ from the parse: {self.n} / {n_want}")

    def _frame_events(self, obj: object, events: list[tuple], batch_ok: bool) -> None:
        """One parsed output frame as the standard events it stands for
        (an output batch: its emits, then its acks, §9.5)."""
        cmd = obj.get("command") if type(obj) is dict else None
        if cmd in ("log", "sync", "metrics"):
            return
        if cmd == "batch" and batch_ok:
            if obj.get("fails"):
                raise BenchError(f"batch with fails: {obj!r:.200}")
            for e in obj.get("emits", ()):
                if len(e) > 2 and e[2] not in (None, "default"):
                    raise BenchError(f"batched emit on stream {e[2]!r}: {obj!r:.200}")
                events.append(("emit", e[0], e[1] if len(e) > 1 else None))
            for tid in obj.get("acks", ()):
                events.append(("ack", tid))
        elif cmd == "emit":
            if obj.get("need_task_ids") is not False:
                raise BenchError(f"emit wanting task ids: {obj!r:.200}")
            if obj.get("stream") not in (None, "default") or obj.get("task") not in (None, 0):
                raise BenchError(f"emit not on the default stream, or direct: {obj!r:.200}")
            events.append(("emit", obj.get("tuple"), obj.get("anchors")))
        elif cmd == "ack":
            events.append(("ack", obj.get("id")))
        else:
            raise BenchError(f"unexpected frame {obj!r:.200}")

    def _check_events(self, events: list[tuple]) -> None:
        """acks: exactly the input ids, in order; emits: the expected values
        in order, anchored to their input, each before that input's ack."""
        acked = [ev[1] for ev in events if ev[0] == "ack"]
        if acked != self.ids:
            raise BenchError(f"acks are not the input ids in order ({len(acked)} acks, expected {self.n})")
        want = [(vals, [tid]) for i, tid in enumerate(self.ids) for vals in self.expected_emits(i)]
        got = [(list(ev[1]), ev[2]) for ev in events if ev[0] == "emit"]
        if got != want:
            bad = next((k for k, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
            raise BenchError(f"emit {bad}: got {got[bad] if bad < len(got) else None!r}, "
                             f"wanted {want[bad] if bad < len(want) else None!r} ({len(got)} emits, {len(want)} expected)")
        done: set[str] = set()
        for ev in events:
            if ev[0] == "ack":
                done.add(ev[1])
            elif ev[2][0] in done:
                raise BenchError(f"emit {ev[1]!r} anchored to {ev[2][0]} after that tuple's ack")

    def _verify_msgpack(self, output: bytes) -> None:
        """msgpack mode (§9.6): split the length-prefixed frames, parse every
        body with the library's strict decoder (one object of JSON's data
        model), expand output batches (only if ``batch`` was offered) into
        the standard frames they stand for, check them as the other modes
        do, and check that the cheap counts of :func:`_consume_mp` /
        :func:`_consume_mp_batch` equal the parse."""
        reader = LengthPrefixedReader()
        try:
            bodies = reader.feed(output) + reader.close()
        except MultilangError as exc:
            raise BenchError(f"msgpack framing: {exc}") from None
        events: list[tuple] = []  # ("emit", values, anchors) | ("ack", id)
        for body in bodies:
            try:
                obj = _mp_loads(body)
            except MultilangError as exc:
                raise BenchError(f"bad msgpack frame: {exc}") from None
            self._frame_events(obj, events, batch_ok=bool(self.batch))
        self._check_events(events)
        f, a, e, cut = (_consume_mp_batch if self.batch else _consume_mp)(output)
        if cut != len(output) or f != len(bodies) or a != self.n or e != self.n_emits:
            raise BenchError(f"byte counts {f} frames / {a} acks / {e} emits / {cut} bytes differ from the parse: "
                             f"{len(bodies)} / {self.n} / {self.n_emits} / {len(output)}")


def _batch_blob(ids: list[str], values: list[list], size: int) -> bytes:
    """``{"tuples": [[id, comp, stream, task, values], ...]}`` frames of ``size`` tuples (§9.5)."""
    out = []
    for lo in range(0, len(ids), size):
        out.append(orjson.dumps({"tuples": [[tid, "spout", "default", 2, vals]
                                            for tid, vals in zip(ids[lo : lo + size], values[lo : lo + size])]}))
    out.append(b"")
    return TERM.join(out)


_PACK = msgpack.Packer(use_bin_type=True).pack
_PACK_LEN = struct.Struct(">I").pack


def _mp_frame(obj) -> bytes:
    """The bytes of ``multilang.codec.msgpack_frame(obj)`` (4-byte big-endian
    length + msgpack body, §9.6) for the str/int/list/dict objects built
    here, without its bin/ext re-check (none can occur): 2x faster to build."""
    body = _PACK(obj)
    return _PACK_LEN(len(body)) + body


# bin and ext format bytes (§9.6: not part of the data model); a body holding
# one goes through the library's full data-model check.
_NOT_JSON_BYTE = re.compile(rb"[\xc4-\xc9\xd4-\xd8]")


def _mp_loads(body: bytes):
    """``multilang.codec.msgpack_loads`` (one object of JSON's data model,
    else MultilangError), with one regex instead of 11 scans per body."""
    if _NOT_JSON_BYTE.search(body):
        return msgpack_loads(body)
    try:
        return msgpack.unpackb(body, raw=False, strict_map_key=True, ext_hook=_no_ext, timestamp=0)
    except Exception:  # ExtraData, OutOfData, FormatError, UnicodeDecodeError, ValueError
        return msgpack_loads(body)  # raises the library's RemoteProtocolError


def _no_ext(code: int, data: bytes):
    raise ValueError(f"ext type {code} is not part of the data model")


def _batch_blob_mp(ids: list[str], values: list[list], size: int) -> bytes:
    """The same tuple batches as :func:`_batch_blob`, as msgpack frames (§9.6)."""
    return b"".join(
        _mp_frame({"tuples": [[tid, "spout", "default", 2, vals]
                                  for tid, vals in zip(ids[lo : lo + size], values[lo : lo + size])]})
        for lo in range(0, len(ids), size))


# --- driver ----------------------------------------------------------------------


def _write_all(fd: int, data) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _count(block: bytes) -> tuple[int, int, int]:
    return (
        block.count(TERM),
        block.count(ACK_FORMS[0]) + block.count(ACK_FORMS[1]),
        block.count(EMIT_FORMS[0]) + block.count(EMIT_FORMS[1]),
    )


BATCH_ACKS = b'"acks":['
BATCH_EMIT_SEP = b'],["'  # between a batched emit's values and its one-id anchor list


def _count_batched(block: bytes) -> tuple[int, int, int]:
    """Frames, acks and emits in complete frames, batch mode, without parsing.

    Acks: standard ack frames, plus for each ``"acks":[`` the commas up to
    the next ``]`` + 1 (ids are digit strings, so the first ``]`` closes the
    array). Emits: standard emit frames plus ``],["`` (a batched emit's
    values followed by its anchor list; the workloads' values are lowercase
    words and integers). Proven equal to a full parse by the verified warm-up."""
    frames, acks, emits = _count(block)
    find, count = block.find, block.count
    pos = find(BATCH_ACKS)
    while pos >= 0:
        start = pos + len(BATCH_ACKS)
        end = find(b"]", start)
        if end > start:
            acks += count(b",", start, end) + 1
        pos = find(BATCH_ACKS, end)
    return frames, acks, emits + count(BATCH_EMIT_SEP)


# msgpack mode (§9.6): the msgpack bytes of the command values. A map's key is
# followed by its value, so ``"command"`` then ``"ack"`` is exactly an ack
# frame, whatever the key order (writers use fixstr for these short strings;
# tuple values here are lowercase words, integers and digit-string ids).
ACK_MP = b"\xa7command\xa3ack"
EMIT_MP = b"\xa7command\xa4emit"
BATCH_MP = b"\xa7command\xa5batch"
_U32 = struct.Struct(">I").unpack_from


def _consume_json(counter):
    """A consume function over ``\\nend\\n`` frames: (frames, acks, emits, cut)
    for the complete frames at the start of ``data`` (``cut`` bytes)."""
    def consume(data: bytes) -> tuple[int, int, int, int]:
        cut = data.rfind(TERM)
        if cut < 0:
            return 0, 0, 0, 0
        cut += len(TERM)
        f, a, e = counter(data if cut == len(data) else data[:cut])
        return f, a, e, cut
    return consume


def _consume_mp(data: bytes) -> tuple[int, int, int, int]:
    """msgpack standard frames: walk the 4-byte length prefixes to the last
    complete frame, then count the ack/emit command bytes in that span (no
    parsing; C-speed counts). Proven equal to a full parse by the warm-up."""
    end = len(data)
    pos = frames = 0
    u32 = _U32
    while end - pos >= 4:
        nxt = pos + 4 + u32(data, pos)[0]
        if nxt > end:
            break
        pos = nxt
        frames += 1
    if not pos:
        return 0, 0, 0, 0
    return frames, data.count(ACK_MP, 0, pos), data.count(EMIT_MP, 0, pos), pos


MP_ACKS_KEY = b"\xa4acks"
MP_EMITS_KEY = b"\xa5emits"


def _mp_array_len(data: bytes, p: int) -> int:
    """The element count of the msgpack array (or nil) whose header is at ``p``."""
    b = data[p]
    if 0x90 <= b <= 0x9F:
        return b & 0x0F
    if b == 0xDC:
        return (data[p + 1] << 8) | data[p + 2]
    if b == 0xDD:
        return _U32(data, p + 1)[0]
    if b == 0xC0:
        return 0
    raise BenchError(f"no msgpack array after a batch key: {data[p - 8 : p + 8]!r}")


def _consume_mp_batch(data: bytes) -> tuple[int, int, int, int]:
    """msgpack + batch: walk the length prefixes; in a frame holding the
    ``"command": "batch"`` bytes (few and large: one per up to 100 tuples),
    read the element counts from the array headers after the ``"acks"`` and
    ``"emits"`` keys (ids are digit strings and no tuple value is one of the
    protocol's words, see Workload, so the first such bytes are the keys);
    count any other frame by its command bytes, as :func:`_consume_mp`.
    Proven equal to a full parse by the verified warm-up."""
    end = len(data)
    pos = frames = acks = emits = 0
    u32, find, count, alen = _U32, data.find, data.count, _mp_array_len
    while end - pos >= 4:
        start = pos + 4
        nxt = start + u32(data, pos)[0]
        if nxt > end:
            break
        if find(BATCH_MP, start, nxt) >= 0:
            k = find(MP_ACKS_KEY, start, nxt)
            if k >= 0:
                acks += alen(data, k + 5)
            k = find(MP_EMITS_KEY, start, nxt)
            if k >= 0:
                emits += alen(data, k + 6)
        else:
            acks += count(ACK_MP, start, nxt)
            emits += count(EMIT_MP, start, nxt)
        frames += 1
        pos = nxt
    return frames, acks, emits, pos


class RunResult:
    def __init__(self, seconds: float, n: int, frames: int, acks: int, emits: int, rc: int) -> None:
        self.seconds = seconds
        self.rate = n / seconds
        self.frames = frames
        self.acks = acks
        self.emits = emits
        self.rc = rc


def drive(
    cmd: list[str],
    wl: Workload,
    *,
    verify: bool = False,
    env: dict | None = None,
    timeout: float = 300.0,
    ok_codes: tuple[int, ...] = (0,),
) -> RunResult:
    """Run one component over the workload; return its timing and counts."""
    err = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, bufsize=0, env=env)
    watchdog = threading.Timer(timeout, proc.kill)
    watchdog.start()
    wfd, rfd = proc.stdin.fileno(), proc.stdout.fileno()

    def fail(why: str) -> BenchError:
        proc.kill()
        proc.wait()
        err.seek(0)
        tail = err.read()[-2000:].decode(errors="replace")
        return BenchError(f"{' '.join(cmd)}: {why}\n--- stderr tail ---\n{tail}")

    try:
        _write_all(wfd, wl.handshake)
        buf = b""
        while TERM not in buf:
            chunk = os.read(rfd, READ_SIZE)
            if not chunk:
                raise fail("EOF before the pid reply")
            buf += chunk
        first, _, data = buf.partition(TERM)
        if b'"pid"' not in first:
            raise fail(f"first frame is not the pid reply: {first[:200]!r}")
        for ext in wl.extensions:
            if f'"{ext}"'.encode() not in first:
                raise fail(f"the {ext} extension was offered but not accepted: {first[:200]!r}")
        if wl.mp:
            consume = _consume_mp_batch if wl.batch else _consume_mp
        else:
            consume = _consume_json(_count_batched if wl.batch else _count)

        writer_done = [0.0]
        writer_err: list[BaseException] = []

        def writer() -> None:
            try:
                view = memoryview(wl.blob)
                for off in range(0, len(view), WRITE_CHUNK):
                    _write_all(wfd, view[off : off + WRITE_CHUNK])
            except OSError as exc:
                writer_err.append(exc)
            writer_done[0] = time.perf_counter()

        th = threading.Thread(target=writer, daemon=True)
        frames = acks = emits = 0
        kept: list[bytes] = []
        n = wl.n
        t0 = time.perf_counter()
        th.start()
        while True:
            f, a, e, cut = consume(data)
            if cut:
                if verify:
                    kept.append(data[:cut])
                data = data[cut:] if cut < len(data) else b""
                frames += f
                acks += a
                emits += e
                if acks >= n:
                    break
            chunk = os.read(rfd, READ_SIZE)
            if not chunk:
                raise fail(f"stdout closed after {acks}/{n} acks")
            data = data + chunk if data else chunk
        t_acks = time.perf_counter()
        th.join()
        if writer_err:
            raise fail(f"writer failed: {writer_err[0]!r}")
        seconds = max(t_acks, writer_done[0]) - t0

        # Shutdown: close stdin (EOF), drain stdout, reap. Not timed.
        proc.stdin.close()
        while True:
            chunk = os.read(rfd, READ_SIZE)
            if not chunk:
                break
            data += chunk
        if data:
            f, a, e, _ = consume(data)
            frames += f
            acks += a
            emits += e
            if verify:
                kept.append(data)
        rc = proc.wait()
        if rc not in ok_codes:
            raise fail(f"exit status {rc}")
        if acks != n or emits != wl.n_emits:
            raise fail(f"counted {acks} acks / {emits} emits, expected exactly {n} / {wl.n_emits}")
        if verify:
            wl.verify(b"".join(kept))
        return RunResult(seconds, n, frames, acks, emits, rc)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        err.close()


# --- the benchmark -----------------------------------------------------------


def component_cmds(kind: str, reply_path: str) -> dict[str, tuple[list[str], tuple[int, ...]]]:
    py = sys.executable
    c = str(COMPONENTS)
    return {
        "driver (cat)": (["sh", "-c", 'exec 3<&0; cat <&3 >/dev/null 3<&- & exec cat "$0" 3<&-', reply_path], (0,)),
        "hand-written": ([py, f"{c}/handwritten.py", kind], (0,)),
        "ours": ([py, f"{c}/ours_{kind}.py"], (0,)),
        # pystorm exits with status 2 when stdin closes ("Storm went away").
        "pystorm": ([py, f"{c}/pystorm_{kind}.py"], (0, 2)),
    }


def time_components(
    plan: dict[str, tuple[list[str], tuple[int, ...], Workload]], repeat: int,
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Warm up every component once (output parsed and verified in full),
    then ``repeat`` timed runs, round-robin; return best tuples/s and the
    seconds of every timed run, per component."""
    best: dict[str, float] = {}
    secs: dict[str, list[float]] = {name: [] for name in plan}
    for name, (cmd, ok, wl) in plan.items():  # warm-up, fully verified
        drive(cmd, wl, verify=True, ok_codes=ok)
    for _ in range(repeat):
        for name, (cmd, ok, wl) in plan.items():
            r = drive(cmd, wl, ok_codes=ok)
            secs[name].append(r.seconds)
            best[name] = max(best.get(name, 0.0), r.rate)
    return best, secs


def bench_batched(kind: str, n: int, scale: int, repeat: int, tmp: str, size: int) -> dict[str, float]:
    """The batched fast path (``--batch``): our bolt and the driver ceiling,
    the driver offering ``batch`` and sending frames of ``size`` tuples."""
    pid_dir = tempfile.mkdtemp(dir=tmp, prefix=f"pids-{kind}-b-")
    full = Workload(kind, n * scale, pid_dir).batched(size)
    reply_path = os.path.join(tmp, f"reply-{kind}-batch.bin")
    with open(reply_path, "wb") as f:
        f.write(full.reply_stream())
    cmds = component_cmds(kind, reply_path)
    plan = {name: (cmds[name][0], cmds[name][1], full) for name in ("driver (cat)", "ours")}
    if kind == "echo":  # the same bolt on the batch-level API (Bolt.process_batch)
        plan["ours, batch API"] = ([sys.executable, str(COMPONENTS / "ours_echo_batch.py")], (0,), full)
    best, secs = time_components(plan, repeat)
    print(f"\n[{kind}, batch {size}] tuple frames of {size}; {len(full.blob) / full.n:.0f} B/tuple in; "
          f"warm-up run of each verified frame by frame; best of {repeat}")
    for name, (cmd, ok, wl) in plan.items():
        runs = ", ".join(f"{x:.2f}" for x in secs[name])
        print(f"  {name:<13} N={wl.n:>7,}  {best[name]:>11,.0f} tuples/s  {1e6 / best[name]:6.2f} us/tuple   runs (s): {runs}")
    return best


def bench_workload(kind: str, n: int, scale: int, repeat: int, tmp: str) -> dict[str, float]:
    """Warm up (verified) and time every component; return best tuples/s.

    pystorm gets the first ``n`` tuples; ours, the hand-written bolt and the
    driver ceiling get the first ``n * scale`` tuples of the same sequence,
    so that their runs are not too short to time reliably, and ours and
    the hand-written bolt run equally long.
    """
    pid_dir = tempfile.mkdtemp(dir=tmp, prefix=f"pids-{kind}-")
    full = Workload(kind, n * scale, pid_dir)
    small = full.take(n)
    reply_path = os.path.join(tmp, f"reply-{kind}.bin")
    with open(reply_path, "wb") as f:
        f.write(full.reply_stream())
    cmds = component_cmds(kind, reply_path)
    plan = {name: (cmd, ok, small if name == "pystorm" else full) for name, (cmd, ok) in cmds.items()}
    best, secs = time_components(plan, repeat)
    print(f"\n[{kind}] {small.n_emits // small.n} emit(s) + 1 ack per tuple; {len(small.blob) / small.n:.0f} B/tuple in; "
          f"warm-up run of each verified frame by frame; best of {repeat}")
    for name, (cmd, ok, wl) in plan.items():
        runs = ", ".join(f"{x:.2f}" for x in secs[name])
        print(f"  {name:<13} N={wl.n:>7,}  {best[name]:>11,.0f} tuples/s  {1e6 / best[name]:6.2f} us/tuple   runs (s): {runs}")
    return best


def print_summary(results: dict[str, dict[str, float]]) -> None:
    print("\n== bolt throughput (tuples/s, best run) ==")
    hdr = f"{'workload':<8} {'driver(cat)':>12} {'hand-written':>13} {'ours':>10} {'pystorm':>10}   {'ours/pystorm':>12} {'ours/hand':>9}"
    print(hdr)
    print("-" * len(hdr))
    for kind, r in results.items():
        print(
            f"{kind:<8} {r['driver (cat)']:>12,.0f} {r['hand-written']:>13,.0f} {r['ours']:>10,.0f} {r['pystorm']:>10,.0f}"
            f"   {r['ours'] / r['pystorm']:>11.2f}x {r['ours'] / r['hand-written']:>8.2f}x"
        )
    for kind, r in results.items():
        head = r["driver (cat)"] / r["hand-written"]
        note = "" if head >= 1.5 else "  <-- WARNING: driver may be limiting"
        print(f"driver ceiling ({kind}): {r['driver (cat)']:,.0f} tuples/s = {head:.1f}x the hand-written bolt{note}")
    if "echo" in results:
        r = results["echo"]
        vs_py, vs_hand = r["ours"] / r["pystorm"], r["ours"] / r["hand-written"]
        print("\ntargets (echo bolt):")
        print(f"  ours >= 4.0x pystorm      : {vs_py:5.2f}x  {'MET' if vs_py >= 4.0 else 'NOT MET'}")
        print(f"  ours >= 0.7x hand-written : {vs_hand:5.2f}x  {'MET' if vs_hand >= 0.7 else 'NOT MET'}")


# --- profiling our library ---------------------------------------------------------


def profile_ours(n: int, tmp: str, top: int = 25) -> None:
    pid_dir = tempfile.mkdtemp(dir=tmp, prefix="pids-prof-")
    wl = Workload("echo", n, pid_dir)
    stats_path = os.path.join(tmp, "ours_echo.prof")
    env = dict(os.environ, BENCH_PROFILE=stats_path)
    r = drive([sys.executable, str(COMPONENTS / "ours_echo.py")], wl, env=env)
    print(f"\n== cProfile: ours echo bolt, N={n} ({r.rate:,.0f} tuples/s under cProfile) ==")
    st = pstats.Stats(stats_path)
    total = st.total_tt
    print(f"total profiled time {total:.2f} s = {total / n * 1e6:.2f} us/tuple (profiler-inflated)")
    rows = []
    for (fn, line, name), (cc, nc, tt, ct, _callers) in st.stats.items():
        rows.append((tt, ct, nc, f"{Path(fn).name}:{line}({name})" if line else name))
    for key, title in ((0, "tottime (self)"), (1, "cumtime")):
        print(f"\n top {top} by {title}:")
        print(f"   {'self us/tup':>11} {'cum us/tup':>10} {'calls/tup':>9}  function")
        for tt, ct, nc, label in sorted(rows, key=lambda x: -x[key])[:top]:
            print(f"   {tt / n * 1e6:>11.3f} {ct / n * 1e6:>10.3f} {nc / n:>9.2f}  {label}")


def stage_breakdown(n: int, batch: int = 0) -> None:
    """Time our library's per-tuple stages in-process, without a profiler.

    Uses multilang's public-ish pieces exactly as component.Bolt does, on the
    same frames the benchmark sends. Read-only use of the library.
    """
    from multilang import Bolt
    from multilang._state import Role, Side
    from multilang.codec import decode_host_frame, encode
    from multilang.connection import NEED_DATA, Connection
    from multilang.framing import FrameReader
    from multilang.messages import Ack, Emit, Pid

    wl = Workload("echo", n, "/tmp")
    chunks = [wl.blob[i : i + 65536] for i in range(0, len(wl.blob), 65536)]

    def fresh_conn() -> Connection:
        c = Connection(Role.BOLT, Side.COMPONENT)
        c.receive_data(wl.handshake)
        c.next_event()
        c.send(Pid(pid=1))
        return c

    def best(fn, setup=lambda: None, reps=5):
        times = []
        for _ in range(reps):
            arg = setup()
            t = time.perf_counter()
            fn(arg)
            times.append(time.perf_counter() - t)
        return min(times) / n * 1e6

    results: list[tuple[str, float]] = []

    # 1. framing only
    def framing(_):
        r = FrameReader()
        for ch in chunks:
            r.feed(ch)

    results.append(("FrameReader.feed (regex split, bytes copies)", best(framing)))

    bodies = []
    r = FrameReader()
    for ch in chunks:
        bodies.extend(r.feed(ch))

    def loads_only(_):
        for b in bodies:
            orjson.loads(b)

    results.append(("orjson.loads alone (floor)", best(loads_only)))

    def decode(_):
        for b in bodies:
            decode_host_frame(b, spout=False)

    results.append(("decode_host_frame (loads + checks + Tuple dataclass)", best(decode)))

    def receive_all(c):
        for ch in chunks:
            c.receive_data(ch)
        while c.next_event() is not NEED_DATA:
            pass

    results.append(("Connection receive_data+next_event (all of input side)", best(receive_all, fresh_conn)))

    # output side
    tups = []
    c0 = fresh_conn()
    for ch in chunks:
        c0.receive_data(ch)
    while (ev := c0.next_event()) is not NEED_DATA:
        tups.append(ev)

    def make_emit(_):
        for t in tups:
            Emit(values=t.values, stream="default", anchors=(t.id,), task=None, need_task_ids=False)

    results.append(("Emit(...) dataclass construction", best(make_emit)))
    emits = [Emit(values=t.values, stream="default", anchors=(t.id,), task=None, need_task_ids=False) for t in tups]

    def enc(_):
        for e in emits:
            encode(e)

    results.append(("codec.encode(Emit) (encode_json + orjson + TERM concat)", best(enc)))

    def dumps_floor(_):
        d = orjson.dumps
        for t in tups:
            d({"command": "emit", "tuple": t.values, "anchors": [t.id], "need_task_ids": False})
            d({"command": "ack", "id": t.id})

    results.append(("orjson.dumps emit+ack dicts alone (floor)", best(dumps_floor)))

    def conn_with_pending():
        c = fresh_conn()
        c.pending.update(t.id for t in tups)
        return c

    def send_emits(c):
        for e in emits:
            c.send(e)

    results.append(("Connection.send(Emit) (state table + anchor check + encode)", best(send_emits, conn_with_pending)))
    acks = [Ack(id=t.id) for t in tups]

    def send_acks(c):
        for a in acks:
            c.send(a)

    results.append(("Connection.send(Ack) (state table + pending.remove + encode)", best(send_acks, conn_with_pending)))

    class Echo(Bolt):
        def process(self, tup):
            self.emit(tup.values, anchors=[tup])
            self.ack(tup)

    def bolt_on(conn: Connection) -> Bolt:
        b = Echo()
        b._conn = conn
        b._bind_fast_paths()  # as Bolt._serve does
        return b

    def bolt_setup():
        return bolt_on(conn_with_pending())

    def bolt_process(b):
        for t in tups:
            b.process(t)
        b._out.clear()

    results.append(("Bolt.process: emit()+ack() incl. send/encode (user-facing)", best(bolt_process, bolt_setup)))

    def whole_loop(b: Bolt, chunks_in: list[bytes]) -> None:
        """Bolt._serve's work without its I/O: bursts of tuples to the
        bolt's handler, other events the general way, one join per chunk."""
        conn = b._conn
        out = b._out
        handle = b._tuple_handler()
        for ch in chunks_in:
            conn.receive_data(ch)
            while True:
                for tup in conn.take_tuples():
                    handle(tup)
                ev = conn.next_event()
                if ev is NEED_DATA:
                    break
                handle(ev)
            if conn.batching:
                out.append(conn.close_batch())
            b"".join(out)
            out.clear()

    results.append(("whole component loop, no syscalls (input+process+join)",
                    best(lambda b: whole_loop(b, chunks), lambda: bolt_on(fresh_conn()))))

    def hand_floor(_):
        loads, dumps = orjson.loads, orjson.dumps
        buf = b""
        for ch in chunks:
            buf += ch
            parts = buf.split(TERM)
            buf = parts.pop()
            out = []
            for body in parts:
                t = loads(body)
                tid = t["id"]
                out.append(dumps({"command": "emit", "tuple": t["tuple"], "anchors": [tid], "need_task_ids": False}))
                out.append(dumps({"command": "ack", "id": tid}))
            out.append(b"")
            TERM.join(out)

    results.append(("hand-written loop, no syscalls (same work)", best(hand_floor)))

    if batch:  # the same loop on the batched fast path (§9.5), --batch
        wlb = wl.batched(batch)
        bchunks = [wlb.blob[i : i + 65536] for i in range(0, len(wlb.blob), 65536)]

        def fresh_batched() -> Connection:
            c = Connection(Role.BOLT, Side.COMPONENT)
            c.receive_data(wlb.handshake)
            c.next_event()
            c.send(Pid(pid=1, extensions=("batch",)))
            return c

        def events_batched(c):
            for ch in bchunks:
                c.receive_data(ch)
                while c.next_event() is not NEED_DATA:
                    pass

        results.append((f"batched {batch}: Connection receive_data+next_event (input side)",
                        best(events_batched, fresh_batched)))

        results.append((f"batched {batch}: whole component loop, no syscalls",
                        best(lambda b: whole_loop(b, bchunks), lambda: bolt_on(fresh_batched()))))

    print(f"\n== in-process stage timings, our library, echo, N={n} (us/tuple, best of 5, no profiler) ==")
    for label, us in results:
        print(f"  {us:7.3f}  {label}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tuples", type=int, default=150_000, help="echo tuples per run for ours/pystorm (default 150000)")
    ap.add_argument("--split-tuples", type=int, default=None, help="split tuples per run (default: tuples/4)")
    ap.add_argument("--ceiling-scale", type=int, default=4, help="hand-written and driver runs use this many times more tuples (default 4)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per component; the best is reported (default 3)")
    ap.add_argument("--only", choices=["echo", "split"], help="run one workload")
    ap.add_argument("--profile", action="store_true", help="then profile our echo bolt (cProfile + in-process stage timings)")
    ap.add_argument("--batch", type=int, default=0, metavar="B",
                    help="then also time our bolts on the batched fast path (spec §9.5), B tuples per frame")
    args = ap.parse_args()
    split_n = args.split_tuples or max(1, args.tuples // 4)

    tmp = tempfile.mkdtemp(prefix="bolt-bench-")
    try:
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load avg {os.getloadavg()[0]:.2f} at start")
        results: dict[str, dict[str, float]] = {}
        if args.only in (None, "echo"):
            results["echo"] = bench_workload("echo", args.tuples, args.ceiling_scale, args.repeat, tmp)
        if args.only in (None, "split"):
            results["split"] = bench_workload("split", split_n, args.ceiling_scale, args.repeat, tmp)
        print_summary(results)
        if args.batch:
            batched: dict[str, dict[str, float]] = {}
            for kind, n in (("echo", args.tuples), ("split", split_n)):
                if args.only in (None, kind):
                    batched[kind] = bench_batched(kind, n, args.ceiling_scale, args.repeat, tmp, args.batch)
            print(f"\n== batched fast path, {args.batch} tuples per frame (tuples/s, best run) ==")
            for kind, r in batched.items():
                std = results[kind]["ours"]
                print(f"{kind:<8} ours batched {r['ours']:>10,.0f}  = {r['ours'] / std:5.2f}x ours standard; "
                      f"driver ceiling {r['driver (cat)']:>11,.0f} = {r['driver (cat)'] / r['ours']:.1f}x ours batched")
                if "ours, batch API" in r:
                    api = r["ours, batch API"]
                    print(f"{kind:<8} ours batched, process_batch {api:>10,.0f}  = {api / std:5.2f}x ours standard "
                          f"(target 4x: {'MET' if api / std >= 4 else 'NOT MET'})")
        print(f"load avg at end {os.getloadavg()[0]:.2f}")
        if args.profile:
            profile_ours(args.tuples, tmp)
            stage_breakdown(min(args.tuples, 100_000), args.batch)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
