"""JSON codec on orjson: messages to frames and frame bodies to messages.

Decoding is direction-aware: a host decodes what a component writes
(:func:`decode_component_frame`); a component decodes what a host writes
(:func:`decode_host_frame`). Every malformed frame raises
``RemoteProtocolError`` carrying the offending bytes.
"""

from __future__ import annotations

import gc
import json
import math
import re
from functools import partial
from typing import Any

import msgpack
import orjson

from .errors import LocalProtocolError, RemoteProtocolError
from .framing import TERMINATOR
from .messages import (
    DEFAULT_STREAM,
    HEARTBEAT_STREAM,
    SYSTEM_COMPONENT,
    SYSTEM_TASK,
    TICK_STREAM,
    Ack,
    Activate,
    Batch,
    Deactivate,
    Emit,
    Error,
    Fail,
    Handshake,
    Heartbeat,
    Log,
    Message,
    Metrics,
    Next,
    Pid,
    STATE_MESSAGES,
    StateInit,
    StatePrepared,
    StateRollback,
    Sync,
    TaskIds,
    Tick,
    Tuple,
    TupleBatch,
    UnknownCommand,
)

__all__ = [
    "dumps",
    "loads",
    "encode",
    "encode_json",
    "decode_component_frame",
    "decode_host_frame",
    "name_unencodable",
    "check_finite",
]


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON. Falls back to the standard library for integers
    beyond 64 bits, which orjson refuses. NaN and the infinities are refused
    (orjson would write them as null: a silent change of meaning)."""
    try:
        out = orjson.dumps(obj)
    except TypeError:
        try:
            return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise LocalProtocolError(f"value is not JSON-serialisable: {exc}", frame=repr(obj), rule="values.json") from None
        except RecursionError:
            raise LocalProtocolError("value is not JSON-serialisable: nested too deeply", frame="(too deep to show)",
                                     rule="values.json") from None
    if _has_null(out):  # rare: only then is the value walked
        check_finite(obj)
    return out


def _has_null(data: bytes) -> bool:
    """Whether ``data`` holds ``null``: orjson writes a float NaN or infinity as
    null, so a body holding no null holds none. Called per emit, so cheap
    (bench/instructions.py): a memchr for ``u`` (the rarest letter of "null"
    in text) rejects most bodies at a third of the cost of a search, and
    ``partition`` is the cheapest search (one argument, no parsing; a regex
    costs half again, bytes' ``in`` with a bytes argument nearly three times,
    as it first tries the argument as an integer). Inlined in
    :meth:`Connection.bolt_fast_paths`, where a call would cost as much."""
    return 117 in data and data.partition(b"null")[1] == b"null"


def check_finite(obj: Any) -> None:
    """LocalProtocolError if ``obj`` holds a float NaN or infinity, which
    JSON has no number for (orjson writes null for them)."""
    stack = [obj]
    while stack:
        v = stack.pop()
        if isinstance(v, float):
            if not math.isfinite(v):
                raise LocalProtocolError(f"value is not JSON-serialisable: {v} is not a JSON number (it would be "
                                         "written as null)", frame=repr(obj), rule="values.json")
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())


def name_unencodable(emits: Any, exc: LocalProtocolError, frame: Any = dumps) -> LocalProtocolError:
    """``exc`` (an output batch no frame could carry, §9.5) told as the first
    emit in ``emits`` whose values or anchors cannot be written, and the
    tuples it was anchored to: the batch is encoded long after the emit
    call, so the batch's text alone would not say which ``process`` wrote it."""
    for emit in emits:
        try:
            frame(emit)
        except LocalProtocolError as inner:
            cause = str(inner).split(" (frame: ", 1)[0]
            second = emit[1] if len(emit) > 1 else None
            whose = f"anchored to tuple(s) {', '.join(map(str, second))}" if isinstance(second, list) else "unanchored"
            return LocalProtocolError(f"an emit {whose} holds a value no frame can carry: {cause}",
                                      frame=repr(emit[0]), rule=exc.rule)
    return exc


# A body at least this long is parsed with the cyclic GC paused (_parse_paused).
PAUSE_GC_BYTES = 8192


def _parse_paused(parse: Any, body: bytes) -> Any:
    """``parse(body)`` with the cyclic garbage collector paused.

    A parse builds a tree, which has no reference cycles, so a collection
    during it can free nothing. A batch frame (§9.5) holds thousands of
    containers, though, and CPython runs a young collection every 700 new
    ones: each walks the half-built tree and promotes it, and every tenth
    young collection brings an older one, until full collections walk the
    whole heap. Measured: orjson.loads of a 2,400-emit batch took 3.1 ms
    instead of 0.43 ms in a process holding 58,000 objects (PySpark, trio and
    pyarrow imported); the host of a Spark ``split`` partition spent 40% of
    its CPU in the collector. Paused, the new tree costs one young collection
    after the parse. Both parsers are one C call that holds the GIL (msgpack
    calls back into Python only for an ext type, which it then refuses), so
    no other thread runs while the collector is paused. A collector that the
    program paused itself is left paused.
    """
    if not gc.isenabled():
        return parse(body)
    gc.disable()
    try:
        return parse(body)
    finally:
        gc.enable()


def loads(body: bytes) -> Any:
    """Parse one frame body. Integers beyond 64 bits become floats (§1.4).
    A long body is parsed with the garbage collector paused (_parse_paused)."""
    try:
        if len(body) >= PAUSE_GC_BYTES:
            return _parse_paused(orjson.loads, body)
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RemoteProtocolError(f"frame is not valid JSON: {exc}", frame=body, rule="frame.json") from None


# --- extension msgpack (§9.6) ---------------------------------------------------

# Format bytes of bin (c4-c6), ext (c7-c9, d4-d8) and floats (ca, cb: NaN
# and infinities are not JSON numbers). They may also occur inside strings
# and numbers; only a body holding one is walked in full.
_NOT_JSON_MARKER = re.compile(rb"[\xc4-\xcb\xd4-\xd8]").search
# Format bytes of maps (80-8f, de, df). A body holding one after its first
# byte may nest a map: the writer then checks its keys are strings.
_INNER_MAP_MARKER = re.compile(rb"[\x80-\x8f\xde\xdf]").search
_INF = float("inf")


def _no_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"ext type {code} is not part of the data model")


def _check_json_model(value: Any) -> None:
    """ValueError unless ``value`` is in JSON's data model (§9.6)."""
    t = type(value)
    if t is dict:
        for k, v in value.items():
            if type(k) is not str:
                raise ValueError(f"msgpack map key {k!r} is not a string (§9.6)")
            _check_json_model(v)
    elif t is list or t is tuple:  # a tuple goes on the wire as an array, as in JSON
        for v in value:
            _check_json_model(v)
    elif t is float:
        if value != value or value == _INF or value == -_INF:
            raise ValueError(f"msgpack float {value} is not a JSON number (§9.6)")
    elif t not in (str, int, bool) and value is not None:
        raise ValueError(f"msgpack {t.__name__} value is not part of the data model (§9.6)")


# strict_map_key: only str (or bin, refused by msgpack_loads) keys, at any depth.
_unpack = partial(msgpack.unpackb, raw=False, strict_map_key=True, ext_hook=_no_ext, timestamp=0)


def msgpack_loads(body: bytes) -> Any:
    """Parse one msgpack frame body (§9.6): exactly one object of JSON's data
    model. bin, ext, non-string keys, bad UTF-8 and trailing bytes raise."""
    try:
        if len(body) >= PAUSE_GC_BYTES:
            obj = _parse_paused(_unpack, body)
        else:
            obj = _unpack(body)
    except Exception as exc:  # ExtraData, OutOfData, FormatError, UnicodeDecodeError, ValueError
        raise RemoteProtocolError(f"frame is not one valid msgpack object: {type(exc).__name__}: {exc}",
                                  frame=body, rule="frame.msgpack") from None
    if _NOT_JSON_MARKER(body) is not None:
        try:
            _check_json_model(obj)
        except ValueError as exc:
            raise RemoteProtocolError(str(exc), frame=body, rule="frame.invalid") from None
    return obj


def _pack_default(obj: Any) -> Any:
    if type(obj) is int:
        raise TypeError(f"integer {obj} is beyond 64 bits")
    raise TypeError(f"{type(obj).__name__} is not part of the data model")


def msgpack_frame(obj: Any) -> bytes:
    """One complete msgpack frame: 4-byte big-endian length + body (§9.6)."""
    try:
        body = msgpack.packb(obj, use_bin_type=True, default=_pack_default)
    except (TypeError, ValueError, OverflowError) as exc:
        raise LocalProtocolError(f"value cannot be sent as msgpack: {exc}", frame=repr(obj), rule="values.json") from None
    # bytes became bin, or a map after the first byte may have a key that is
    # not a string (JSON would refuse both): not ours to send (§9.6)
    if _NOT_JSON_MARKER(body) is not None or _INNER_MAP_MARKER(body, 1) is not None:
        try:
            _check_json_model(obj)
        except ValueError as exc:
            raise LocalProtocolError(str(exc), frame=repr(obj), rule="values.json") from None
    return len(body).to_bytes(4, "big") + body


# --- encoding ----------------------------------------------------------------


def encode_json(msg: Message) -> Any:
    """The JSON value for a message, as it goes on the wire."""
    t = type(msg)
    if t is Emit:
        obj: dict[str, Any] = {"command": "emit", "tuple": msg.values}
        if msg.stream != DEFAULT_STREAM:
            obj["stream"] = msg.stream
        if msg.anchors:
            obj["anchors"] = list(msg.anchors)
        if msg.id is not None:
            obj["id"] = msg.id
        if msg.task is not None:
            obj["task"] = msg.task
        if not msg.need_task_ids:
            obj["need_task_ids"] = False
        return obj
    if t is Tuple or t is Tick:
        return {"id": msg.id, "comp": msg.component, "stream": msg.stream, "task": msg.task, "tuple": msg.values}
    if t is Ack:
        return {"command": "ack", "id": msg.id}
    if t is Fail:
        return {"command": "fail", "id": msg.id}
    if t is TaskIds:
        return msg.task_ids
    if t is Sync:
        return {"command": "sync"}
    if t is Heartbeat:
        return {"id": msg.id, "comp": None, "stream": HEARTBEAT_STREAM, "task": SYSTEM_TASK, "tuple": []}
    if t is Next:
        return {"command": "next", "id": ""}
    if t is Activate:
        return {"command": "activate", "id": ""}
    if t is Deactivate:
        return {"command": "deactivate", "id": ""}
    if t is Log:
        return {"command": "log", "msg": msg.msg, "level": msg.level}
    if t is Error:
        return {"command": "error", "msg": msg.msg}
    if t is Metrics:
        return {"command": "metrics", "name": msg.name, "params": msg.params}
    if t is Handshake:
        obj = {"pidDir": msg.pid_dir, "conf": msg.conf, "context": msg.context}
        if msg.extensions:  # §9.1: a host that offers nothing omits the key
            obj["extensions"] = list(msg.extensions)
        return obj
    if t is Pid:
        obj = {"pid": msg.pid}
        if msg.extensions:
            obj["extensions"] = list(msg.extensions)
        return obj
    if t is TupleBatch:
        return {"tuples": [[u.id, u.component, u.stream, u.task, u.values] for u in msg.tuples]}
    if t is Batch:
        obj = {"command": "batch"}
        if msg.emits:
            obj["emits"] = msg.emits
        if msg.acks:
            obj["acks"] = msg.acks
        if msg.fails:
            obj["fails"] = msg.fails
        return obj
    if t in _STATE_ACTIONS:
        return _encode_state(msg, _STATE_ACTIONS[t])
    if t is UnknownCommand:
        return msg.frame
    raise LocalProtocolError(f"cannot encode {t.__name__}")


_STATE_ACTIONS = {cls: action for action, cls in STATE_MESSAGES.items()}


def _encode_state(msg: Any, action: str) -> dict[str, Any]:
    """A state frame (§9.7): ``command``, ``action``, ``txid``, then the body."""
    obj: dict[str, Any] = {"command": "state", "action": action, "txid": msg.txid}
    t = type(msg)
    if t is StateInit:
        obj["state"] = msg.state
    elif t is StatePrepared:
        obj["put"] = msg.put
        obj["delete"] = msg.delete
    if getattr(msg, "more", False):
        obj["more"] = True
    return obj


def encode(msg: Message) -> bytes:
    """One complete frame: JSON text + ``\\nend\\n`` (§1.1)."""
    return dumps(encode_json(msg)) + TERMINATOR


# --- decoding: what a component wrote (host side) -----------------------------


def _str_id(value: Any, what: str, frame: Any) -> str:
    # §3.6: tuple ids are strings; a number is a broken component (it would
    # lose precision on 64-bit ids), not something to coerce.
    if type(value) is not str:
        raise RemoteProtocolError(f"{what} id must be the string it was given, got {type(value).__name__}", frame=frame, rule="ids.string-echo")
    return value


def _int(value: Any, what: str, frame: Any) -> int:
    if type(value) is not int:
        raise RemoteProtocolError(f"{what} must be an integer", frame=frame, rule="frame.invalid")
    return value


def _emit(obj: dict[str, Any], body: bytes) -> Emit:
    values = obj.get("tuple")
    if type(values) is not list:
        raise RemoteProtocolError("emit needs 'tuple' as a JSON list", frame=body, rule="frame.invalid")
    stream = obj.get("stream")
    if stream is None:
        stream = DEFAULT_STREAM
    elif type(stream) is not str:
        raise RemoteProtocolError("emit 'stream' must be a string", frame=body, rule="frame.invalid")
    anchors: Any = obj.get("anchors")
    if anchors is None:
        anchors = ()
    elif type(anchors) is str:  # §3.5: one anchor may be sent bare
        anchors = (anchors,)
    elif type(anchors) is list:
        for a in anchors:
            _str_id(a, "anchor", body)
        anchors = tuple(anchors)
    else:
        raise RemoteProtocolError("emit 'anchors' must be a list of tuple id strings", frame=body, rule="frame.invalid")
    task = obj.get("task")
    if task is not None:
        task = _int(task, "emit 'task'", body)
        if task == 0:  # §3.5: absent or 0 is a normal emit
            task = None
    need = obj.get("need_task_ids", True)
    if type(need) is not bool:
        raise RemoteProtocolError("'need_task_ids' must be a JSON boolean", frame=body, rule="frame.invalid")
    return Emit(values=values, stream=stream, anchors=anchors, id=obj.get("id"), task=task, need_task_ids=need)


def decode_component_frame(body: bytes, *, loads: Any = loads) -> Message:
    """Decode a frame written by a component (bolt or spout). ``loads``
    parses the body (JSON; :func:`msgpack_loads` under §9.6)."""
    obj = loads(body)
    if type(obj) is not dict:
        raise RemoteProtocolError("a component frame must be a JSON object", frame=body, rule="frame.invalid")
    cmd = obj.get("command")
    if cmd == "emit":
        return _emit(obj, body)
    if cmd == "ack":
        return Ack(id=obj.get("id"))
    if cmd == "fail":
        return Fail(id=obj.get("id"))
    if cmd == "sync":
        return Sync()
    if cmd == "log":
        msg = obj.get("msg")
        level = obj.get("level", 2)
        if type(level) is not int or level not in (0, 1, 2, 3, 4):
            level = 2  # §3.7: anything else is INFO
        return Log(msg=msg if type(msg) is str else orjson.dumps(msg).decode(), level=level)
    if cmd == "error":
        msg = obj.get("msg")
        return Error(msg=msg if type(msg) is str else orjson.dumps(msg).decode())
    if cmd == "batch":
        return _batch(obj, body)
    if cmd == "metrics":
        name = obj.get("name")
        if type(name) is not str:
            raise RemoteProtocolError("metrics needs a string 'name'", frame=body, rule="frame.invalid")
        return Metrics(name=name, params=obj.get("params"))
    if cmd == "state":
        return _state_frame(obj, body)
    if cmd is None:
        if "pid" in obj:
            pid = _int(obj["pid"], "'pid'", body)
            ext = obj.get("extensions") or []
            if type(ext) is not list or not all(type(e) is str for e in ext):
                raise RemoteProtocolError("'extensions' must be a list of strings", frame=body, rule="frame.invalid")
            return Pid(pid=pid, extensions=tuple(ext))
        raise RemoteProtocolError("frame has no 'command'", frame=body, rule="frame.invalid")
    if type(cmd) is not str:
        raise RemoteProtocolError("'command' must be a string", frame=body, rule="frame.invalid")
    return UnknownCommand(command=cmd, frame=obj)


def _state_frame(obj: dict[str, Any], body: bytes) -> Message:
    """The shape of a state frame (§9.7, rule ``state.invalid``); who may
    send it and when is the connection's business."""
    action = obj.get("action")
    cls = STATE_MESSAGES.get(action) if type(action) is str else None
    if cls is None:
        raise RemoteProtocolError(f"unknown state action {action!r} (init, prepare, prepared, commit, rollback; §9.7)",
                                  frame=body, rule="state.invalid")
    txid = obj.get("txid")
    if not (type(txid) is int and txid >= 1 or txid is None and cls in (StateInit, StateRollback)):
        raise RemoteProtocolError(f"state {action} 'txid' must be an integer >= 1"
                                  + (" or null" if cls in (StateInit, StateRollback) else "") + f", got {txid!r}",
                                  frame=body, rule="state.invalid")
    more = obj.get("more", False)
    if type(more) is not bool:
        raise RemoteProtocolError("state 'more' must be a boolean", frame=body, rule="state.invalid")
    if cls is StateInit:
        state = obj.get("state")
        if type(state) is not dict:
            raise RemoteProtocolError("state init needs 'state' as an object", frame=body, rule="state.invalid")
        return StateInit(txid=txid, state=state, more=more)
    if cls is StatePrepared:
        put, delete = obj.get("put"), obj.get("delete")
        if type(put) is not dict or type(delete) is not list or not all(type(k) is str for k in delete):
            raise RemoteProtocolError("state prepared needs 'put' as an object and 'delete' as an array of strings",
                                      frame=body, rule="state.invalid")
        if delete and not put.keys().isdisjoint(delete):
            both = sorted(put.keys() & set(delete))[:3]
            raise RemoteProtocolError(f"state prepared names key(s) {both} in both 'put' and 'delete'", frame=body,
                                      rule="state.invalid")
        return StatePrepared(txid=txid, put=put, delete=delete, more=more)
    return cls(txid=txid)


def _batch(obj: dict[str, Any], body: bytes) -> Batch:
    """The shape of an output batch (§9.5); the connection checks ids. Each
    emit element is completed in place to ``[tuple, anchors_or_id, stream]``
    (an absent second element null, an absent or null stream "default"), so
    that every reader of a batch takes three elements, decoded once here."""
    emits = obj.get("emits") or []
    acks = obj.get("acks") or []
    fails = obj.get("fails") or []
    if type(emits) is not list or type(acks) is not list or type(fails) is not list:
        raise RemoteProtocolError("batch 'emits', 'acks' and 'fails' must be arrays", frame=body, rule="frame.invalid")
    for e in emits:
        if type(e) is not list or not 1 <= (n := len(e)) <= 3 or type(e[0]) is not list:
            raise RemoteProtocolError("each batched emit must be [tuple, anchors_or_id, stream]", frame=body, rule="frame.invalid")
        if n == 3:
            if e[2] is None:
                e[2] = DEFAULT_STREAM
            elif type(e[2]) is not str:
                raise RemoteProtocolError("a batched emit's stream must be a string or null", frame=body, rule="frame.invalid")
        else:
            e.extend(_DEFAULTS[n])
    for tid in acks:
        _str_id(tid, "batched ack", body)
    for tid in fails:
        _str_id(tid, "batched fail", body)
    return Batch(emits=emits, acks=acks, fails=fails)


def _tuple_batch(items: Any, body: bytes) -> TupleBatch:
    if type(items) is not list or not items:
        raise RemoteProtocolError("'tuples' must be a non-empty array", frame=body, rule="frame.invalid")
    out: list[Tuple] = []
    for it in items:
        if (type(it) is not list or len(it) != 5 or type(it[0]) is not str or type(it[2]) is not str
                or type(it[3]) is not int or type(it[4]) is not list):
            raise RemoteProtocolError("each batched tuple must be [id, comp, stream, task, tuple]", frame=body, rule="frame.invalid")
        if it[2] == HEARTBEAT_STREAM:
            raise RemoteProtocolError("heartbeats are never batched (§9.5)", frame=body, rule="frame.invalid")
        cls = Tick if it[2] == TICK_STREAM and it[1] == SYSTEM_COMPONENT else Tuple
        out.append(_new_tuple(cls, it))
    return TupleBatch(tuples=out)


#: What an emit element of ``n`` elements lacks (§9.5): [tuple] and [tuple, anchors_or_id].
_DEFAULTS = {1: (None, DEFAULT_STREAM), 2: (DEFAULT_STREAM,)}

_new_tuple = tuple.__new__  # builds a Tuple without its generated keyword __new__


# --- decoding: what a host wrote (component side) -----------------------------

_SPOUT_COMMANDS = {"next": Next, "activate": Activate, "deactivate": Deactivate}


def decode_host_frame(body: bytes, *, spout: bool, loads: Any = loads) -> Message:
    """Decode a frame written by the host to a bolt (``spout=False``) or spout."""
    obj = loads(body)
    if type(obj) is list:
        for t in obj:
            _int(t, "task id", body)
        return TaskIds(task_ids=obj)
    if type(obj) is not dict:
        raise RemoteProtocolError("a host frame must be a JSON object or a task-id list", frame=body, rule="frame.invalid")
    if "pidDir" in obj:
        pid_dir = obj["pidDir"]
        if type(pid_dir) is not str:
            raise RemoteProtocolError("'pidDir' must be a string", frame=body, rule="frame.invalid")
        conf = obj.get("conf") or {}
        context = obj.get("context") or {}
        if type(conf) is not dict or type(context) is not dict:
            raise RemoteProtocolError("handshake 'conf' and 'context' must be JSON objects", frame=body, rule="frame.invalid")
        offer = obj.get("extensions") or []
        if type(offer) is not list or not all(type(e) is str for e in offer):
            raise RemoteProtocolError("handshake 'extensions' must be a list of strings (§9.1)", frame=body,
                                      rule="frame.invalid")
        return Handshake(pid_dir=pid_dir, conf=conf, context=context, extensions=tuple(offer))
    if "tuples" in obj and not spout:
        return _tuple_batch(obj["tuples"], body)
    if not spout and obj.get("command") == "state":
        return _state_frame(obj, body)
    if spout:
        cmd = obj.get("command")
        if cmd == "ack":
            return Ack(id=obj.get("id"))
        if cmd == "fail":
            return Fail(id=obj.get("id"))
        cls = _SPOUT_COMMANDS.get(cmd)
        if cls is not None:
            return cls()
        if type(cmd) is str:
            return UnknownCommand(command=cmd, frame=obj)
        if "tuple" in obj or "tuples" in obj:
            raise RemoteProtocolError("this spout got a tuple, a bolt's input: the topology runs this program as a "
                                      "bolt (declare it as a spout, or write it as a Bolt)", frame=body,
                                      rule="frame.invalid")
        raise RemoteProtocolError("spout frame has no 'command'", frame=body, rule="frame.invalid")
    tid = obj.get("id")
    stream = obj.get("stream")
    if type(tid) is not str or type(stream) is not str:
        if obj.get("command") in _SPOUT_COMMANDS:
            raise RemoteProtocolError(f"this bolt got the spout command {obj['command']!r}: the topology runs this "
                                      "program as a spout (declare it as a bolt, or write it as a Spout)", frame=body,
                                      rule="frame.invalid")
        raise RemoteProtocolError("a tuple needs string 'id' and 'stream'", frame=body, rule="frame.invalid")
    if stream == HEARTBEAT_STREAM:
        return Heartbeat(id=tid)
    values = obj.get("tuple")
    if type(values) is not list:
        raise RemoteProtocolError("a tuple needs 'tuple' as a JSON list", frame=body, rule="frame.invalid")
    comp = obj.get("comp")
    task = obj.get("task")
    if type(task) is not int:
        raise RemoteProtocolError("a tuple needs an integer 'task'", frame=body, rule="frame.invalid")
    if stream == TICK_STREAM and comp == SYSTEM_COMPONENT:
        return Tick(id=tid, component=comp, stream=stream, task=task, values=values)
    return Tuple(id=tid, component=comp, stream=stream, task=task, values=values)
