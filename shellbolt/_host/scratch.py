"""The host's private scratch folders in the temporary directory: the pid
folders (§2.1), a run's state store when no ``--state-dir`` is named, the
host workers' sockets, the Spark engine's and source's temporary folders
(``multilang.shellbolt.scratch_folder``); not conform's pid folder (conform
checks what a component writes there, and removes its own). Each is made
mode 0700 and names its owner (pid and start time). A run removes its own
when it ends; one whose owner was killed (kill -9: no ``finally`` runs) is
removed by the next host process that makes one, so repeated kills do not
fill the disk.

A pid folder also names the component processes its owner started and has
not reaped (:func:`note_child`): a host killed with kill -9 leaves them
running, and one that ignores the end of its input and SIGTERM would run on
for ever. The sweep ends each such process group with SIGKILL before it
removes the folder, as Storm's supervisor kills the pids in a dead worker's
pid folder, and says so. A process being started has no pid to write down
yet: it is written down first by a mark in its environment
(:func:`note_spawning`), which the sweep looks for in /proc.

A folder that holds Unix sockets must keep their paths within the kernel's
limit (107 bytes on Linux): where the temporary directory's path is too long
for that (a deep ``TMPDIR``), it is made in ``/tmp`` instead, as Python's
multiprocessing does for its sockets."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile

from multilang.errors import MultilangError

from .pids import cmdline, group, is_running, signal_group, start_time, with_environ

__all__ = ["make", "owner_tag", "owner_gone", "note_spawning", "forget_spawning", "note_child", "forget_child",
           "leave_the_sweep_to_the_main_process", "CHILD_ENV"]

log = logging.getLogger("multilang.shellbolt")

_OWNER = ".multilang-owner"
_CHILD = ".multilang-child-"  # + the pid of a process group's leader: "START_TIME WHAT"
_SPAWNING = ".multilang-spawning-"  # + a mark (CHILD_ENV's value) of a process being started: "WHAT"
#: in a component's environment: which start of which host process started it ("PID-START.N")
CHILD_ENV = "MULTILANG_CHILD_OF"
_marks = 0
_PREFIXES = ("multilang-pids-", "multilang-state-", "multilang-workers-", "multilang-replay-", "multilang-spark-",
             "multilang-ship-")
_SHORT = ("/tmp", "/var/tmp", "/usr/tmp")
#: the longest socket path the kernel takes (sun_path is 108 bytes, with its NUL)
MAX_SOCKET_PATH = 107
_swept = False


def make(prefix: str, socket_name_len: int = 0) -> str:
    """A new private folder ``<tmp>/<prefix>XXXX`` owned by this process;
    the first call in a process also removes those of dead owners. With
    ``socket_name_len``, a socket of a name that long in it must fit
    MAX_SOCKET_PATH (a MultilangError naming TMPDIR where no temporary
    directory is short enough)."""
    global _swept
    assert prefix in _PREFIXES, prefix
    if not _swept:
        _swept = True
        sweep()
    base = tempfile.gettempdir()
    if socket_name_len:
        room = MAX_SOCKET_PATH - len(prefix) - 8 - 2 - socket_name_len  # (mkdtemp's 8 characters, two slashes)
        if len(os.fsencode(base)) > room:
            short = [d for d in _SHORT if len(d) <= room and os.path.isdir(d) and os.access(d, os.W_OK | os.X_OK)]
            if not short:
                raise MultilangError(f"the temporary directory {base!r} is too long a path for the host workers' "
                                     f"sockets (at most {room} bytes), and none of {', '.join(_SHORT)} can be "
                                     "used: set TMPDIR to a shorter one")
            base = short[0]
    path = tempfile.mkdtemp(prefix=prefix, dir=base)
    with open(os.path.join(path, _OWNER), "w", encoding="ascii") as f:
        f.write(f"{os.getpid()} {start_time(os.getpid()) or ''} {_pid_namespace()}")
    return path


def leave_the_sweep_to_the_main_process() -> None:
    """In a host worker: :func:`make` sweeps nothing. The main process sweeps
    as it starts and ends, and ends a dead worker's components itself after
    their graces (docs/WORKERS.md); a worker started again sweeping the
    folder of the one before would kill them at once."""
    global _swept
    _swept = True


def sweep() -> list[str]:
    """Remove this user's scratch folders whose owner is no longer running;
    return their paths. A folder that names no owner (being made, or made
    by an older version) is left alone."""
    uid, removed, entries = os.getuid(), [], []
    for root in dict.fromkeys((tempfile.gettempdir(), _SHORT[0])):  # (sockets' folders may be in /tmp)
        try:
            entries += os.scandir(root)
        except OSError:
            pass
    for e in entries:
        if not e.name.startswith(_PREFIXES):
            continue
        try:
            if not e.is_dir(follow_symlinks=False) or e.stat(follow_symlinks=False).st_uid != uid:
                continue
            with open(os.path.join(e.path, _OWNER), encoding="ascii") as f:
                pid_text, started, *namespace = f.read().split(" ")
            pid = int(pid_text)
        except (OSError, ValueError):
            continue
        if namespace and namespace[0] != _pid_namespace():
            continue  # (a container's, sharing this temporary directory: its pids are not the ones seen here)
        if not is_running(pid, started):
            _end_children(e.path, pid)
            shutil.rmtree(e.path, ignore_errors=True)
            removed.append(e.path)
    return removed


def owner_tag() -> str:
    """This process, as a file's name can say that it owns the file:
    ``PID-STARTED`` (its start time in clock ticks, where the system tells)."""
    return f"{os.getpid()}-{start_time(os.getpid()) or ''}"


def owner_gone(tag: str) -> bool:
    """Whether the process an :func:`owner_tag` names has ended (a pid now
    used by another process included). False for what is not such a tag."""
    pid, sep, started = tag.partition("-")
    if not sep or not pid.isdigit() or not (started.isdigit() or not started):
        return False
    return not is_running(int(pid), started)


def _ours(folder: str) -> bool:
    """Whether ``folder`` is a scratch folder or a folder in one (not a pid
    folder the host was given)."""
    return (os.path.exists(os.path.join(folder, _OWNER))
            or os.path.exists(os.path.join(os.path.dirname(folder), _OWNER)))


def _write(path: str, text: str) -> bool:
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError:
        return False
    return True


def note_spawning(folder: str, what: str) -> str | None:
    """Before the owner of ``folder`` starts a process for ``what`` (a
    component and task): a mark to put in its environment as
    :data:`CHILD_ENV`, written down in ``folder`` (None where the folder is
    not ours). If the owner is killed before :func:`note_child`, the sweep
    finds the process, and its children, by the mark (a trial killed hosts
    in the milliseconds between a spawn and its record, and 2 of 6 such
    kills left a component running for ever)."""
    global _marks
    if not _ours(folder):
        return None
    _marks += 1
    mark = f"{owner_tag()}.{_marks}"
    return mark if _write(os.path.join(folder, f"{_SPAWNING}{mark}"), what) else None


def forget_spawning(folder: str, mark: str) -> None:
    """The process of ``mark`` is written down by its pid, or did not start."""
    try:
        os.unlink(os.path.join(folder, f"{_SPAWNING}{mark}"))
    except OSError:
        pass


def note_child(folder: str, pid: int, started: str, what: str) -> None:
    """Write down in ``folder``, if it is a scratch folder or a folder in
    one, that its owner started process ``pid`` (at ``started``; the leader
    of a process group) for ``what`` (a component and task): if the owner is
    killed before it reaps the process, the sweep ends its group
    (:func:`forget_child` once reaped)."""
    if _ours(folder):
        _write(os.path.join(folder, f"{_CHILD}{pid}"), f"{started} {what}")


def forget_child(folder: str, pid: int) -> None:
    try:
        os.unlink(os.path.join(folder, f"{_CHILD}{pid}"))
    except OSError:
        pass


def _pid_namespace() -> str:
    """This process's pid namespace ("pid:[4026531836]"; Linux), or ""."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _end_children(folder: str, owner: int) -> None:
    """SIGKILL what is left of the process groups that the dead owner of
    ``folder`` started and never reaped (:func:`note_child`, in the folder
    or a folder in it), and say what was left."""
    records = []
    for where in [folder] + [e.path for e in _entries(folder) if e.is_dir(follow_symlinks=False)]:
        records += [os.path.join(where, e.name) for e in _entries(where) if e.name.startswith((_CHILD, _SPAWNING))]
    records.sort(key=lambda path: _SPAWNING in path)  # (a process written down both ways: said once, by its pid)
    ended: set[int] = set()
    for path in records:
        name = os.path.basename(path)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
            if name.startswith(_CHILD):
                started, _, what = text.partition(" ")
                pid = int(name[len(_CHILD):])
                found = group(pid, started)
            else:  # (started as its owner died: found by its mark, with what it started in turn)
                what, pid, started = text, 0, ""
                found = [p for p in with_environ(f"{CHILD_ENV}={name[len(_SPAWNING):]}") if p not in ended]
        except (OSError, ValueError):
            continue
        ended.update(found)
        left = [f"pid {p} ({_short(cmdline(p)) or '?'})" for p in found]
        if not left:
            continue
        if pid:
            signal_group(pid, started, signal.SIGKILL)
        for p in [] if pid else found:
            try:
                os.killpg(p, signal.SIGKILL) if os.getpgid(p) == p else os.kill(p, signal.SIGKILL)
            except OSError:
                pass  # (gone meanwhile: with its group, say)
        log.warning("%s: %s still ran after its host process (pid %d) had gone without ending %s (killed "
                    "with kill -9?): killed (SIGKILL to its process group)", what, ", ".join(left), owner,
                    "it" if len(left) == 1 else "them")


def _short(command: str, most: int = 80) -> str:
    """``command`` in at most ``most`` characters: its program by its name
    (``python3``, not the folders it is in), then, where it is still too
    long, its middle left out (its end, the script and flags, names it)."""
    program, space, args = command.partition(" ")
    text = os.path.basename(program) + space + args
    if len(text) <= most:
        return text
    head = (most - 3) // 2
    return text[:head] + "..." + text[-(most - 3 - head):]


def _entries(folder: str) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as it:
            return list(it)
    except OSError:
        return []
