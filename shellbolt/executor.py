"""Transitional: the old home of the runtime, split into ``runtime.py``,
``tasks.py``, ``shell_task.py``, ``bolts.py``, ``spouts.py`` and
``results.py``. Removed once the adapters import from those."""

from .bolts import PythonBoltTask, ShellBoltTask
from .results import ComponentStats, DeadLetter, RunResult
from .results import hashable as _hashable
from .results import sort_key as _sort_key
from .runtime import Runtime
from .spouts import PythonSpoutTask, ShellSpoutTask
from .tasks import Delivery, Task
from .tasks import plain_emit as _plain_emit

_new_tuple = tuple.__new__

__all__ = ["Runtime", "RunResult", "ComponentStats", "DeadLetter", "PythonBoltTask", "ShellBoltTask",
           "PythonSpoutTask", "ShellSpoutTask", "Delivery", "Task"]
