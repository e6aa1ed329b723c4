"""Which process a pid names: its start time (Linux's ``/proc``), so that a
pid the kernel has given to another process since is not taken for the one
that had it (a scratch folder's owner, a dead host worker's components)."""

from __future__ import annotations

import os
import signal

__all__ = ["start_time", "is_running", "signal_group", "children", "group", "cmdline", "with_environ"]


def _fields(pid: int | str) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command's name ("pid (comm)
    state ppid ..."): state first (Linux), or None (no such process)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields if len(fields) > 19 else None


def _stat(pid: int) -> tuple[str, str] | None:
    """The process's state letter and start time in clock ticks since boot
    (Linux's /proc), or None."""
    fields = _fields(pid)
    return None if fields is None else (fields[0].decode(), fields[19].decode())


def _pids() -> list[str]:
    """Every process's pid, as /proc names it (Linux; elsewhere none)."""
    try:
        return [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []


def _where(index: int, pid: int) -> list[tuple[int, list[bytes]]]:
    """Each process whose stat field ``index`` (after the name: 1 the
    parent, 2 the process group) is ``pid``, with its fields, sorted by pid
    (Linux's /proc; elsewhere none)."""
    wanted = str(pid).encode()
    return sorted((int(e), f) for e in _pids() if (f := _fields(e)) is not None and f[index] == wanted)


def children(pid: int) -> list[int]:
    """The pids whose parent is ``pid``, zombies included, sorted (Linux's
    /proc; elsewhere none)."""
    return [p for p, _ in _where(1, pid)]


def group(pid: int, started: str) -> list[int]:
    """The processes of the process group that process ``pid`` (started at
    ``started``) leads or led, the leader included while it runs; zombies
    not counted; none if the pid is another process's now (Linux's /proc;
    elsewhere none). See :func:`signal_group` for why a group without its
    leader is still the one it led."""
    stat = _stat(pid)
    if not started or (stat is not None and stat[1] != started):
        return []
    if stat is None:
        try:
            os.killpg(pid, 0)  # (one call, where most groups are gone with their leader: no /proc walk)
        except OSError:
            return []
    return [p for p, f in _where(2, pid) if f[0] != b"Z"]


def with_environ(entry: str) -> list[int]:
    """The live processes (zombies not counted) whose environment, as they
    started, holds ``entry`` ("NAME=VALUE"), sorted (Linux's /proc, this
    user's processes; elsewhere none)."""
    wanted, found = b"\0" + entry.encode() + b"\0", []
    for e in _pids():
        try:
            with open(f"/proc/{e}/environ", "rb") as f:
                if wanted not in b"\0" + f.read():
                    continue
        except OSError:  # gone, or another user's
            continue
        fields = _fields(e)
        if fields is not None and fields[0] != b"Z":
            found.append(int(e))
    return sorted(found)


def cmdline(pid: int) -> str:
    """The process's command line, its arguments joined by spaces ("" if gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), or None."""
    stat = _stat(pid)
    return None if stat is None else stat[1]


def is_running(pid: int, started: str | None) -> bool:
    """Whether process ``pid`` is the one that started at ``started`` (a pid
    reused by another process is not; without a start time to compare, any
    process with the pid is taken for it, and another user's always is)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process has the pid now: not ours to judge
    now = start_time(pid)
    return not started or now is None or now == started


def signal_group(pid: int, started: str, sig: int = signal.SIGKILL) -> bool:
    """Send ``sig`` to the process group that process ``pid`` leads (our
    component processes each lead one: §5.4), if it is still the process
    that started at ``started``; True if it went to that process running.
    Where the process has exited, what is left of its group (a wrapper's
    children) gets SIGKILL, and the answer is False: whether it is not reaped
    yet, or gone (the kernel gives no new process a pid that is still a
    process group's id, so a group of that id without its leader is what is
    left of the one it led)."""
    if not started:
        return False  # (no start time to be sure the pid is still the one we started)
    stat = _stat(pid)
    if stat is None:  # (gone: its group's other members, if any are left)
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        return False
    if stat[1] != started:
        return False  # (the pid is another process's now: that process leads no group of ours)
    exited = stat[0] == "Z"
    try:
        os.killpg(pid, signal.SIGKILL if exited else sig)
    except OSError:
        return False
    return not exited
