"""A stateful bolt's key-value state (spec/PROTOCOL.md §9.7).

:class:`KeyValueState` is what ``StatefulBolt.state`` holds: a map from
string keys to JSON values (§1.4), changed only through :meth:`~KeyValueState.put`
and :meth:`~KeyValueState.delete`. Besides the map it remembers what a
checkpoint needs (the bolt's loop drives it; the names with an underscore
are not for bolt code):

* the *dirty* keys, changed since the last ``init``, ``prepared`` or
  ``rollback``, with each one's value as of then: the next ``prepared``
  carries them (``put`` for the keys present, ``delete`` for the others);
* the *undo record*: for every key changed since the last ``init`` or
  ``commit``, its value as of then (or that it was absent), which a
  ``rollback`` restores.

A ``commit`` makes the state as of its ``prepared`` the new base: the undo
record becomes the values, as of that ``prepared``, of the keys changed since
it (usually none).

Values are the state's own: :meth:`~KeyValueState.put` stores a copy of a
list or an object, and :meth:`~KeyValueState.get` returns one, so changing a
value in place never changes the state behind its back (it would be missing
from the next ``prepared`` and from the undo record). Get, change, put back.
"""

from __future__ import annotations

from typing import Any, Iterator

from .codec import dumps

__all__ = ["KeyValueState", "CHUNK_KEYS", "CHUNK_BYTES"]

#: A ``prepared`` frame carries at most this many keys (``put`` and ``delete``
#: together); more go in further chunks (§9.7 "Chunks").
CHUNK_KEYS = 1000
#: ... and about this many bytes of keys and values (a key and its value are
#: never split: one bigger than this is a chunk of its own).
CHUNK_BYTES = 1 << 20

_ABSENT = object()  # in a dirty or undo record: the key was not in the state
_SCALARS = frozenset((str, int, float, bool, type(None)))
_INF = float("inf")
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1  # §1.4: integers beyond read back as floats


def _owned(value: Any, key: str) -> Any:
    """A copy of ``value`` that the state owns; ValueError (naming ``key``)
    unless it is a JSON value as the codec takes it under JSON and msgpack
    alike (§1.4, §9.6: what ``codec._check_json_model`` accepts): strings,
    integers within 64 bits, finite floats, true/false/null, lists (or tuples)
    and objects with string keys of those."""
    t = type(value)
    if t in _SCALARS:
        if t is int and not _INT_MIN <= value <= _INT_MAX:
            raise ValueError(f"state value of key {key!r}: integer {value} is beyond 64 bits; it would come back "
                             "as a float (§1.4)")
        if t is float and (value != value or value in (_INF, -_INF)):
            raise ValueError(f"state value of key {key!r}: {value} is not a JSON number (§1.4)")
        return value
    if t is list or t is tuple:
        return [_owned(v, key) for v in value]
    if t is dict:
        for k in value:
            if type(k) is not str:
                raise ValueError(f"state value of key {key!r}: object key {k!r} is not a string (§1.4)")
        return {k: _owned(v, key) for k, v in value.items()}
    raise ValueError(f"state value of key {key!r}: {t.__name__} is not a JSON value (§1.4)")


def _copy(value: Any) -> Any:
    """A copy of a value already owned (lists and objects copied, all the way down)."""
    t = type(value)
    if t is list:
        return [v if type(v) in _SCALARS else _copy(v) for v in value]
    if t is dict:
        return {k: v if type(v) in _SCALARS else _copy(v) for k, v in value.items()}
    return value


def _check_key(key: Any) -> None:
    if type(key) is not str:
        raise TypeError(f"state keys are strings, got {key!r} ({type(key).__name__})")


class KeyValueState:
    """A stateful bolt's state: string keys, JSON values (§9.7).

    ``key in state``, ``len(state)``, :meth:`get`, :meth:`keys` and
    :meth:`items` read it; :meth:`put` and :meth:`delete` change it. Under a
    host that offers extension ``state`` the changes are checkpointed and
    come back in the next process (§9.7); under Storm's host the state lives
    in this process's memory only, as with Storm's default
    ``InMemoryKeyValueStateProvider``.
    """

    __slots__ = ("_data", "_dirty", "_undo")

    def __init__(self, data: dict[str, Any] | None = None) -> None:
        self._data: dict[str, Any] = {}
        #: key -> its value as of the last init / prepared / rollback (or _ABSENT)
        self._dirty: dict[str, Any] = {}
        #: key -> its value as of the last init / commit (or _ABSENT)
        self._undo: dict[str, Any] = {}
        if data:
            for k, v in data.items():
                self.put(k, v)
            self._dirty.clear()
            self._undo.clear()

    # -- reading ---------------------------------------------------------------

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key`` (a copy, for a list or an object), or ``default``."""
        value = self._data.get(key, _ABSENT)
        if value is _ABSENT:
            return default
        return value if type(value) in _SCALARS else _copy(value)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def keys(self) -> list[str]:
        """The keys, in the order they were first put."""
        return list(self._data)

    def items(self) -> list[tuple[str, Any]]:
        """``(key, value)`` pairs (values copied, as :meth:`get` returns them)."""
        return [(k, v if type(v) in _SCALARS else _copy(v)) for k, v in self._data.items()]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __repr__(self) -> str:
        return f"KeyValueState({self._data!r})"

    # -- changing --------------------------------------------------------------

    def put(self, key: str, value: Any) -> None:
        """Set ``key`` to ``value``: a copy of it, checked to be a JSON value
        (TypeError for a key that is not a string, ValueError naming the key
        for a value that is not JSON: NaN, bytes, a set, an object key that
        is not a string, ...)."""
        _check_key(key)
        owned = _owned(value, key)
        self._changing(key)
        self._data[key] = owned

    def delete(self, key: str) -> None:
        """Remove ``key`` (nothing happens if it is not there)."""
        _check_key(key)
        if key in self._data:
            self._changing(key)
            del self._data[key]

    def _changing(self, key: str) -> None:
        """Before ``key`` changes: remember its value where nothing is remembered yet."""
        dirty, undo = self._dirty, self._undo
        if key not in dirty or key not in undo:
            old = self._data.get(key, _ABSENT)
            dirty.setdefault(key, old)
            undo.setdefault(key, old)

    # -- the checkpoint protocol (§9.7), driven by StatefulBolt -----------------

    def _init(self, data: dict[str, Any]) -> None:
        """``init``: the state becomes ``data`` (the host's, so JSON values); nothing dirty, nothing to undo."""
        self._data = data
        self._dirty = {}
        self._undo = {}

    def _prepare(self, max_keys: int = CHUNK_KEYS, max_bytes: int = CHUNK_BYTES) -> list[tuple[dict[str, Any], list[str]]]:
        """``prepare``: the changes since the last init / prepared / rollback as
        ``(put, delete)`` chunks (at least one, maybe empty), each within
        ``max_keys`` keys and about ``max_bytes`` bytes; nothing is dirty after."""
        data = self._data
        chunks: list[tuple[dict[str, Any], list[str]]] = []
        put: dict[str, Any] = {}
        delete: list[str] = []
        size = 0
        for key in self._dirty:
            value = data.get(key, _ABSENT)
            # bytes of '"key":value,' in the frame (a deleted key: '"key",')
            n = len(dumps(key)) + 1 + (len(dumps(value)) + 1 if value is not _ABSENT else 0)
            if put or delete:
                if len(put) + len(delete) >= max_keys or size + n > max_bytes:
                    chunks.append((put, delete))
                    put, delete, size = {}, [], 0
            if value is _ABSENT:
                delete.append(key)
            else:
                put[key] = value  # (encoded at once, by the caller)
            size += n
        chunks.append((put, delete))
        self._dirty = {}
        return chunks

    def _commit(self) -> None:
        """``commit``: the state as of the last ``prepared`` is the new base;
        what changed since then is what a rollback would now undo."""
        self._undo = dict(self._dirty)

    def _rollback(self) -> None:
        """``rollback``: back to the state as of the last init or commit."""
        data = self._data
        for key, old in self._undo.items():
            if old is _ABSENT:
                data.pop(key, None)
            else:
                data[key] = old
        self._dirty = {}
        self._undo = {}
