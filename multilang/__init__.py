"""multilang-bridge: Apache Storm's multilang protocol for Python and Spark.

The component library (write bolts and spouts in Python)::

    from multilang import BasicBolt

    class Split(BasicBolt):
        def process(self, tup):
            for word in tup.values[0].split():
                self.emit([word])

    Split().run()

A :class:`StatefulBolt` also keeps ``self.state``, a :class:`KeyValueState`
that a host with extension ``state`` checkpoints (spec/PROTOCOL.md §9.7).

The sans-IO protocol core lives in :mod:`multilang.connection`,
:mod:`multilang.framing`, :mod:`multilang.codec` and :mod:`multilang.messages`;
the host runtime in :mod:`multilang.shellbolt`; engines in :mod:`multilang.adapters`.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from . import errors
from .errors import *  # noqa: F403 - every exception: errors.__all__ names them

if _TYPE_CHECKING:
    from ._state import Role, Side, State
    from ._component import (DEBUG, ERROR, INFO, TRACE, WARN, BasicBolt, Bolt, Component, Spout, StatefulBolt,
                             release_stdout)
    from .connection import NEED_DATA, Connection
    from .messages import Tick, TopologyContext, Tuple, Tuples
    from ._kv_state import KeyValueState
    from ._libraries import library_path

__version__ = "0.1.0"

#: Names load on first use (PEP 562): ``import multilang`` itself costs
#: almost nothing, so the console script (``_entry``) installs its signal
#: handlers before the rest of the package is read.
_LAZY = {
    **dict.fromkeys(("Role", "Side", "State"), "_state"),
    **dict.fromkeys(("DEBUG", "ERROR", "INFO", "TRACE", "WARN", "BasicBolt", "Bolt", "Component", "Spout",
                     "StatefulBolt", "release_stdout"), "_component"),
    **dict.fromkeys(("NEED_DATA", "Connection"), "connection"),
    **dict.fromkeys(("Tick", "TopologyContext", "Tuple", "Tuples"), "messages"),
    "KeyValueState": "_kv_state",
    "library_path": "_libraries",
}


def __getattr__(name: str) -> _Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'multilang' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})

__all__ = [
    "Bolt",
    "BasicBolt",
    "StatefulBolt",
    "KeyValueState",
    "Spout",
    "Component",
    "Tuple",
    "Tuples",
    "Tick",
    "TopologyContext",
    "Connection",
    "NEED_DATA",
    "Role",
    "Side",
    "State",
    "TRACE",
    "DEBUG",
    "INFO",
    "WARN",
    "ERROR",
    "release_stdout",
    "library_path",
    "__version__",
]
#: The exceptions (multilang/errors.py lists them); this form, unlike a
#: starred entry above, is one that type checkers read.
__all__ += errors.__all__
