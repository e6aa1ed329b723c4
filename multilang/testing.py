"""Helpers for testing multilang components and topologies.

Three groups, usable from any test runner (this module does not import
pytest; every failed check raises ``AssertionError``):

**A byte-level host.** :class:`ComponentProcess` starts one component process
(any language: an argv list, no shell) and plays the host against it with
nothing but bytes: it writes frames, or any raw bytes, to the component's
stdin, splits its stdout into frames, collects its stderr, and closes stdin
and waits for the exit. It deliberately uses nothing else from ``multilang``
(not the codec, not the sans-IO core), so a bug there cannot hide the same
bug in a component library under test. Every read, write and wait has a
deadline, so a broken component fails a check instead of hanging the test.
:class:`ComponentProcesses` starts several with common settings and closes
them all at the end (the usual body of a pytest fixture)::

    from multilang.testing import ComponentProcess, tuple_frame

    with ComponentProcess(["ruby", "split_bolt.rb"], cwd="examples/ruby") as bolt:
        bolt.handshake()                                   # checks the pid reply and the pid file
        bolt.send(tuple_frame("1", ["the cow jumped"]))
        assert bolt.read_n(4)[-1] == {"command": "ack", "id": "1"}
        bolt.close_stdin()
        assert bolt.wait() == 0

Frame builders (:func:`tuple_frame`, :func:`heartbeat_frame`, ...) and
:func:`same_json` (JSON equality that does not let ``1 == 1.0 == True``) go
with it.

**Process checks**, from ``/proc`` (Linux): :func:`child_pids`,
:func:`descendant_pids`, :func:`alive`, :func:`gone`, :func:`running`,
:func:`cmdline`, and :func:`assert_no_orphans` ("every component process is
reaped and this process has no children left").

**Under trio**: :func:`wait_until` waits for a condition in a coroutine.

**Topologies under the runtime**: :func:`run_topology` runs one under a hard
time limit and watches its processes (:class:`TopologyRun`); :func:`current_pid`
names the process now running a task. They load ``multilang.shellbolt``
(and trio) only when called.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

from ._early_output import release

release()  # a host of components: its stdout is its own (multilang.release_stdout)

__all__ = [
    "DEFAULT_TIMEOUT",
    "DEFAULT_CONTEXT",
    "ComponentProcess",
    "ComponentProcesses",
    "encode_frame",
    "tuple_frame",
    "heartbeat_frame",
    "tick_frame",
    "command_frame",
    "tuple_batch",
    "same_json",
    "child_pids",
    "Seen",
    "descendant_pids",
    "alive",
    "gone",
    "running",
    "cmdline",
    "process_name",
    "assert_no_orphans",
    "wait_until",
    "TopologyRun",
    "run_topology",
    "current_pid",
]

#: Seconds a read, a write or a wait may take by default: generous, a healthy
#: component answers in milliseconds.
DEFAULT_TIMEOUT = 5.0

#: A handshake context (spec §2.2) for a bolt ``split`` (task 2) fed by a spout
#: ``spout`` (task 1, shuffle) and feeding ``count`` (task 3, fields ``word``).
DEFAULT_CONTEXT: dict[str, Any] = {
    "task->component": {"1": "spout", "2": "split", "3": "count"},
    "taskid": 2,
    "componentid": "split",
    "streams": ["default"],
    "stream->outputfields": {"default": ["word"]},
    "stream->target->grouping": {"default": {"count": {"type": "FIELDS", "fields": ["word"]}}},
    "source->stream->grouping": {"spout": {"default": {"type": "SHUFFLE"}}},
    "source->stream->fields": {"spout": {"default": ["sentence"]}},
}

_TERMINATOR = b"\nend\n"
_SHOW = 300  # bytes of unread output quoted in a failure message
_STDERR_TAIL = 2000  # characters of stderr quoted in a failure message


# ---------------------------------------------------------------------------
# Frames
# ---------------------------------------------------------------------------


def encode_frame(obj: Any, *, ensure_ascii: bool = False) -> bytes:
    """``obj`` as one frame: compact JSON and the ``end`` line (spec §1.1).

    Raw UTF-8 by default, as our hosts write it; ``ensure_ascii=True`` writes
    ``\\u`` escapes instead, as ``storm.py`` does."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=ensure_ascii).encode() + _TERMINATOR


def tuple_frame(id: str, values: list[Any], *, comp: str | None = "spout", stream: str = "default",
                task: int = 1) -> dict[str, Any]:
    """A bolt's input tuple (spec §3.1)."""
    return {"id": id, "comp": comp, "stream": stream, "task": task, "tuple": values}


def heartbeat_frame(id: str = "hb") -> dict[str, Any]:
    """A heartbeat tuple (spec §3.3): a bolt answers ``{"command": "sync"}``."""
    return {"id": id, "comp": None, "stream": "__heartbeat", "task": -1, "tuple": []}


def tick_frame(id: str, secs: int = 5) -> dict[str, Any]:
    """A tick tuple (``__system`` / ``__tick``) carrying its frequency."""
    return {"id": id, "comp": "__system", "stream": "__tick", "task": -1, "tuple": [secs]}


def command_frame(command: str, id: Any = "") -> dict[str, Any]:
    """A spout command: ``next``, ``ack``, ``fail``, ``activate``, ``deactivate``."""
    return {"id": id, "command": command}


def tuple_batch(*tuples: Mapping[str, Any]) -> dict[str, Any]:
    """A tuple batch of the ``batch`` extension (spec §9.5) from :func:`tuple_frame` dicts."""
    return {"tuples": [[t["id"], t["comp"], t["stream"], t["task"], t["tuple"]] for t in tuples]}


def same_json(a: Any, b: Any) -> bool:
    """Equality that also insists on JSON types: ``0 != "0"``, ``1 != 1.0``, ``True != 1``."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b))
    return a == b


# ---------------------------------------------------------------------------
# The byte-level host
# ---------------------------------------------------------------------------


class ComponentProcess:
    """One component process driven byte by byte; the host side of the protocol.

    ``argv`` is started with stdin, stdout and stderr on pipes, in ``cwd``,
    with ``env`` added to this process's environment. Two threads read stdout
    and stderr as they come, so the component never blocks on a full pipe;
    :attr:`stdout` and :attr:`stderr` hold every byte read so far.

    ``pid_dir`` is the handshake's pid directory (created if missing); without
    one, a private temporary directory is made and removed by :meth:`close`.
    ``conf`` and ``context`` are what :meth:`handshake` sends unless told
    otherwise (``{}`` and :data:`DEFAULT_CONTEXT`). ``timeout`` is the default
    deadline of every read, write and wait. :meth:`send` writes raw UTF-8
    JSON, or ``\\u`` escapes with ``ensure_ascii=True``. The reader accepts
    ``\\n`` line endings only, which is what our component libraries write;
    ``accept_crlf=True`` also takes ``\\r\\n``.

    Every failed expectation raises ``AssertionError`` with the unread output
    and the component's stderr. Use it as a context manager, or call
    :meth:`close`: the process is killed if still running, then reaped.
    """

    def __init__(self, argv: Sequence[str | os.PathLike[str]], *, cwd: str | os.PathLike[str] | None = None,
                 env: Mapping[str, str] | None = None, pid_dir: str | os.PathLike[str] | None = None,
                 conf: Mapping[str, Any] | None = None, context: Mapping[str, Any] | None = None,
                 timeout: float = DEFAULT_TIMEOUT, ensure_ascii: bool = False, accept_crlf: bool = False) -> None:
        self.argv = [os.fspath(a) for a in argv]
        self.timeout = timeout
        self.ensure_ascii = ensure_ascii
        self.accept_crlf = accept_crlf
        self.conf = dict(conf) if conf is not None else {}
        self.context = dict(context) if context is not None else DEFAULT_CONTEXT
        self._own_pid_dir = pid_dir is None
        if pid_dir is None:
            self.pid_dir = Path(tempfile.mkdtemp(prefix="multilang-test-"))  # mode 0700
        else:
            self.pid_dir = Path(pid_dir)
            self.pid_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=None if cwd is None else os.fspath(cwd),
                env=None if env is None else {**os.environ, **env},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                bufsize=0,
            )
        except BaseException:
            self._remove_pid_dir()
            raise
        os.set_blocking(self.proc.stdin.fileno(), False)
        #: every byte the component wrote to stdout so far (grows while it runs)
        self.stdout = bytearray()
        #: every byte the component wrote to stderr so far (grows while it runs)
        self.stderr = bytearray()
        self._pos = 0  # start of the next unread frame in self.stdout
        self._scan = 0  # start of the first line not yet looked at
        self._eof = False
        self._cond = threading.Condition()
        self._threads = [
            threading.Thread(target=self._drain, args=(self.proc.stdout, self.stdout, True), daemon=True,
                             name=f"multilang-testing-stdout-{self.proc.pid}"),
            threading.Thread(target=self._drain, args=(self.proc.stderr, self.stderr, False), daemon=True,
                             name=f"multilang-testing-stderr-{self.proc.pid}"),
        ]
        for t in self._threads:
            t.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def __enter__(self) -> ComponentProcess:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ComponentProcess pid {self.proc.pid} {self.argv!r}>"

    def _drain(self, pipe: Any, buf: bytearray, is_stdout: bool) -> None:
        fd = pipe.fileno()
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:
                chunk = b""
            with self._cond:
                if chunk:
                    buf.extend(chunk)
                elif is_stdout:
                    self._eof = True
                self._cond.notify_all()
            if not chunk:
                return

    # -- diagnostics --------------------------------------------------------

    def stderr_text(self, limit: int | None = None) -> str:
        """What the component wrote to stderr (its last ``limit`` characters), decoded leniently."""
        with self._cond:
            text = self.stderr.decode("utf-8", "replace")
        return text if limit is None else text[-limit:]

    def _context(self) -> str:
        unread = bytes(self.stdout[self._pos:])
        return f"unread stdout: {unread[:_SHOW]!r}; stderr:\n{self.stderr_text(_STDERR_TAIL)}"

    # -- writing ------------------------------------------------------------

    def write(self, data: bytes, timeout: float | None = None) -> None:
        """Write raw bytes to the component's stdin; fail if it does not take them in time."""
        timeout = self.timeout if timeout is None else timeout
        fd = self.proc.stdin.fileno()
        view = memoryview(data)
        deadline = time.monotonic() + timeout
        while view:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"the component did not read its stdin within {timeout:g}s "
                                     f"({len(view)} bytes unwritten); {self._context()}")
            select.select([], [fd], [], min(left, 0.1))
            try:
                n = os.write(fd, view[: 1 << 16])
            except BlockingIOError:
                continue
            except BrokenPipeError as exc:
                status = self.proc.poll()
                raise AssertionError(f"cannot write to the component's stdin (exit status {status}): {exc}; "
                                     f"{self._context()}") from exc
            view = view[n:]

    def send(self, obj: Any, timeout: float | None = None) -> None:
        """Write ``obj`` as one frame (compact JSON, ``\\nend\\n``)."""
        self.write(encode_frame(obj, ensure_ascii=self.ensure_ascii), timeout)

    def close_stdin(self) -> None:
        """Close the component's stdin: end of stream, after which it should exit 0."""
        self.proc.stdin.close()

    # -- reading ------------------------------------------------------------

    def _next_frame(self) -> bytes | None:
        """The next complete frame's text, consumed; ``None`` if there is none yet. Lock held."""
        buf = self.stdout
        while True:
            nl = buf.find(b"\n", self._scan)
            if nl < 0:
                return None
            start, self._scan = self._scan, nl + 1
            line = buf[start:nl]
            if line == b"end" or (self.accept_crlf and line == b"end\r"):
                text = bytes(buf[self._pos:start - 1]) if start > self._pos else b""
                self._pos = self._scan
                if self.accept_crlf:
                    text = b"\n".join(ln[:-1] if ln.endswith(b"\r") else ln for ln in text.split(b"\n"))
                return text

    def _frame_or_eof(self, timeout: float | None) -> bytes | None:
        """The next frame's text, or None once stdout is closed; fails after ``timeout``."""
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                text = self._next_frame()
                if text is not None or self._eof:
                    return text
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no frame within {timeout:g}s and stdout still open; {self._context()}")
                self._cond.wait(left)

    def read_raw(self, timeout: float | None = None) -> bytes:
        """The JSON text of the next frame, as bytes (the ``end`` line stripped)."""
        text = self._frame_or_eof(timeout)
        if text is None:
            raise AssertionError(f"the component closed its stdout; {self._context()}")
        return text

    def read(self, timeout: float | None = None) -> Any:
        """The next frame, parsed."""
        text = self.read_raw(timeout)
        try:
            return json.loads(text)
        except ValueError as exc:
            raise AssertionError(f"a frame that is not JSON: {text[:_SHOW]!r}") from exc

    def read_n(self, n: int, timeout: float | None = None) -> list[Any]:
        """The next ``n`` frames, parsed (``timeout`` applies to each)."""
        return [self.read(timeout) for _ in range(n)]

    def read_eof(self, timeout: float | None = None) -> None:
        """Expect the component to close its stdout with no further frame."""
        text = self._frame_or_eof(timeout)
        if text is not None:
            raise AssertionError(f"unexpected frame {text[:_SHOW]!r} instead of the end of stdout")

    def expect_silence(self, seconds: float = 0.25) -> None:
        """Expect nothing new on stdout for ``seconds``: no byte past the last
        frame read, and no end of stream."""
        deadline = time.monotonic() + seconds
        with self._cond:
            while True:
                if len(self.stdout) > self._pos:
                    raise AssertionError(f"unexpected output: {bytes(self.stdout[self._pos:])[:_SHOW]!r}")
                if self._eof:
                    raise AssertionError(f"the component closed its stdout; {self._context()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(left)

    def wait_stderr(self, needle: bytes, timeout: float | None = None) -> None:
        """Wait until ``needle`` appears on the component's stderr."""
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._cond:
            while needle not in self.stderr:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{needle!r} not on stderr within {timeout:g}s; stderr:\n"
                                         f"{self.stderr.decode('utf-8', 'replace')[-_STDERR_TAIL:]}")
                self._cond.wait(min(left, 0.1))

    # -- the protocol --------------------------------------------------------

    def handshake(self, conf: Mapping[str, Any] | None = None, context: Mapping[str, Any] | None = None, *,
                  offer: Sequence[str] | None = None, accept: Sequence[str] = ()) -> dict[str, Any]:
        """Send the handshake (spec §2.2) and check the pid reply (§2.3); return the reply.

        ``offer`` is the handshake's ``extensions`` (the host's offer, §9.1); ``accept``
        is the ``extensions`` the reply must list (§9.2; none by default).
        Checks: the reply is the very first line on stdout, it is exactly
        ``{"pid": <the process's pid>}`` (plus ``extensions``) with JSON types,
        and an empty file ``<pidDir>/<pid>`` exists.
        """
        conf = dict(self.conf if conf is None else conf)
        frame = {"pidDir": str(self.pid_dir), "conf": conf, "context": self.context if context is None else context}
        if offer is not None:
            frame["extensions"] = list(offer)
        self.send(frame)
        # Nothing may come before the pid reply: stdout starts with it (one line, then "end").
        first = self.read_raw()
        assert first.startswith(b"{") and b"\n" not in first, \
            f"stdout does not start with the pid reply: {bytes(self.stdout[:80])!r}"
        try:
            reply = json.loads(first)
        except ValueError:
            raise AssertionError(f"the pid reply is not JSON: {first[:_SHOW]!r}") from None
        want: dict[str, Any] = {"pid": self.proc.pid}
        if accept:
            want["extensions"] = list(accept)
        assert same_json(reply, want), f"pid reply {reply!r}, want {want!r}"
        pid_file = self.pid_dir / str(self.proc.pid)
        assert pid_file.is_file() and pid_file.stat().st_size == 0, f"no empty pid file {pid_file}"
        return reply

    # -- the end -------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the process to exit; its exit status."""
        timeout = self.timeout if timeout is None else timeout
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the component is still running after {timeout:g}s; stderr:\n"
                                 f"{self.stderr_text(_STDERR_TAIL)}") from None

    def wait_closed(self, timeout: float | None = None) -> bool:
        """Wait until the component's stdout and stderr are closed (after it
        exited, and its children too), so :attr:`stdout` and :attr:`stderr`
        hold all it wrote. False if they are still open after ``timeout``."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def close(self) -> None:
        """Kill the process if it still runs, reap it, and release its pipes."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(self.timeout)
        # Join the readers before closing their fds: a closed fd number can be
        # reused by the next process's pipes, and a stale reader would steal
        # from it. A reader still blocked (a grandchild holds the pipe) keeps
        # its fd open.
        if self.wait_closed():
            for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                try:
                    pipe.close()
                except OSError:
                    pass
        self._remove_pid_dir()

    def _remove_pid_dir(self) -> None:
        if self._own_pid_dir:
            shutil.rmtree(self.pid_dir, ignore_errors=True)


class ComponentProcesses:
    """Starts :class:`ComponentProcess` objects with common settings and closes
    them all at the end; a context manager::

        @pytest.fixture
        def start(tmp_path):
            with ComponentProcesses(cwd=tmp_path, pid_dir=tmp_path / "pids") as procs:
                yield procs.start
    """

    def __init__(self, **settings: Any) -> None:
        self.settings = settings
        self.processes: list[ComponentProcess] = []

    def start(self, argv: Sequence[str | os.PathLike[str]], *, handshake: bool = False,
              **settings: Any) -> ComponentProcess:
        """Start ``argv`` (``settings`` override the common ones); with ``handshake``, do the handshake too."""
        proc = ComponentProcess(argv, **{**self.settings, **settings})
        self.processes.append(proc)
        if handshake:
            proc.handshake()
        return proc

    def close(self) -> None:
        """Close every process started (each is tried even if one fails)."""
        procs, self.processes = self.processes, []
        error: BaseException | None = None
        for proc in procs:
            try:
                proc.close()
            except BaseException as exc:  # noqa: BLE001 - closed the others first
                error = error or exc
        if error is not None:
            raise error

    def __enter__(self) -> ComponentProcesses:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


# ---------------------------------------------------------------------------
# Processes, from /proc
# ---------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def child_pids(pid: int | None = None) -> list[int]:
    """Pids whose parent is ``pid`` (default: this process), zombies included;
    not the JVM of this process's SparkSession, which lives as long as the
    session (a test run's, shared by its Spark tests), not as long as a test."""
    from multilang.shellbolt import child_pids as children

    pid = os.getpid() if pid is None else pid
    jvm = _spark_gateway_pid() if pid == os.getpid() else None
    return [kid for kid in children(pid) if kid != jvm]


def _spark_gateway_pid() -> int | None:
    import sys

    context = getattr(sys.modules.get("pyspark"), "SparkContext", None)
    gateway = getattr(context, "_gateway", None)
    proc = getattr(gateway, "proc", None)
    return getattr(proc, "pid", None)


def descendant_pids(pid: int | None = None) -> list[int]:
    """Children, grandchildren... of ``pid`` (default: this process)."""
    out: list[int] = []
    todo = [os.getpid() if pid is None else pid]
    while todo:
        kids = child_pids(todo.pop())
        out += kids
        todo += kids
    return out


def alive(pid: int) -> bool:
    """A process with this pid exists (a zombie not yet reaped counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def gone(pid: int) -> bool:
    """No process with this pid exists any more: it exited and was reaped."""
    return not alive(pid)


def running(pid: int) -> bool:
    """The process exists and is not a zombie. (A grandchild killed with its
    group is reparented to init and may stay a zombie until init reaps it:
    dead, not leaked.)"""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


class Seen:
    """Processes seen, each by its pid and start time: a later look at one
    of them is of that process, not of a new one the kernel gave its pid
    (pids wrap at 32768 by default, soon on a machine running a test suite)."""

    def __init__(self, pids: Iterable[int] = ()) -> None:
        self._started: dict[int, str] = {}
        self.add(pids)

    def add(self, pids: Iterable[int]) -> None:
        for pid in pids:
            fields = _stat_fields(pid)
            if fields is not None:
                self._started.setdefault(pid, fields[19])  # (starttime, field 22 of /proc/PID/stat)

    def __iter__(self) -> Iterator[int]:
        return iter(self._started)

    def __len__(self) -> int:
        return len(self._started)

    def running(self) -> list[int]:
        """Those of them still running (:func:`running`), the same processes."""
        return [pid for pid, t in self._started.items()
                if (f := _stat_fields(pid)) is not None and f[0] != "Z" and f[19] == t]


def cmdline(pid: int) -> str:
    """The process's command line, arguments joined by spaces ("" if gone)."""
    from multilang.shellbolt import process_cmdline

    return process_cmdline(pid)


def process_name(pid: int) -> str:
    """The process's name (``/proc/PID/comm``: what ``top`` and ``pgrep``
    show; a host worker's is ``multilang-wN``), "" if gone."""
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""


def assert_no_orphans(pids: Any = (), *, parent: int | None = None,
                      timeout: float = 0.0) -> None:
    """Nothing was left behind: every pid in ``pids`` is :func:`gone` (reaped,
    not a zombie) and ``parent`` (default: this process) has no children.

    ``pids`` may be a ``TopologyRun``: its component pids, of which there
    must be some (a run that saw none did not check anything). With
    ``timeout``, wait up to that long for the processes to go.
    """
    seen = getattr(pids, "pids", None)
    if seen is not None:  # a TopologyRun
        assert seen, "the run started component processes"
        pids = seen
    pids = list(pids)
    parent = os.getpid() if parent is None else parent
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in pids if not gone(p)]
        kids = child_pids(parent)
        if (not left and not kids) or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    assert not left, f"component processes left behind (running or unreaped): {_describe(left)}"
    assert kids == [], f"process {parent} still has children: {_describe(kids)}"


def _describe(pids: list[int]) -> str:
    return ", ".join(f"{p} ({cmdline(p) or '?'})" for p in pids)


async def wait_until(pred: Callable[[], bool], timeout: float = 10, poll: float = 0.002) -> None:
    """(trio) Return once ``pred()`` is true; ``trio.TooSlowError`` after ``timeout`` seconds."""
    import trio

    with trio.fail_after(timeout):
        while not pred():
            await trio.sleep(poll)


# ---------------------------------------------------------------------------
# Topologies under the runtime
# ---------------------------------------------------------------------------


@dataclass
class TopologyRun:
    """What :func:`run_topology` saw."""

    #: the runtime's result (``RunResult``)
    result: Any = None
    #: the ``multilang.shellbolt.Runtime``
    runtime: Any = None
    #: every output record with the trio time it came at
    outputs: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    #: every component pid seen during the run
    pids: set[int] = field(default_factory=set)
    #: task id -> pids of its processes, in start order
    task_pids: dict[int, list[int]] = field(default_factory=dict)
    #: seconds (trio time) the run took
    elapsed: float = 0.0

    def records(self, component: str, stream: str = "default") -> list[dict[str, Any]]:
        """The output records of ``component`` on ``stream``, in order."""
        return [r for _, r in self.outputs if r.get("component") == component and r.get("stream") == stream]


_R = TypeVar("_R", bound=TopologyRun)


def current_pid(runtime: Any, task_id: int) -> int | None:
    """The pid of the process now running task ``task_id`` of a Runtime, if any."""
    proc = getattr(runtime.tasks[task_id], "proc", None)
    if proc is not None and proc.proc is not None:
        return proc.proc.pid
    return None


def run_topology(topology: Any, *, during: Callable[[Any], Awaitable[None]] | None = None, limit: float = 120,
                 sample_every: float = 0.003, run_type: type[_R] = TopologyRun,  # type: ignore[assignment]
                 stop_when: Callable[[_R], bool] | None = None, **run_kw: Any) -> _R:
    """Run ``topology`` under a ``multilang.shellbolt.Runtime`` in ``trio.run``.

    ``run_kw`` go to ``Runtime.run`` (``until_done`` defaults to true unless
    a ``duration`` is given). ``during(runtime)``, if given, runs beside it
    and is cancelled when the run ends. ``stop_when(run)``, if given, is
    asked every ``sample_every`` seconds what the run has delivered so far;
    once it is true the run is stopped as by a signal (``request_stop``):
    a run that waits for its outputs, not for a wall-clock window, passes
    on a busy machine. The whole run fails (``TooSlowError``) after
    ``limit`` seconds. Every ``sample_every`` seconds the pids of the
    component processes are noted. Returns a ``run_type`` (a
    :class:`TopologyRun` or a subclass).
    """
    import trio

    from multilang.shellbolt import Runtime

    run_kw.setdefault("until_done", "duration" not in run_kw)

    async def main() -> _R:
        run = run_type()
        run.runtime = rt = Runtime(topology, on_output=lambda rec: run.outputs.append((trio.current_time(), rec)))

        async def sample_pids() -> None:
            while True:
                for task_id in rt.tasks:
                    pid = current_pid(rt, task_id)
                    if pid is not None:
                        run.pids.add(pid)
                        seen = run.task_pids.setdefault(task_id, [])
                        if not seen or seen[-1] != pid:
                            seen.append(pid)
                await trio.sleep(sample_every)

        async def stop_once_delivered(enough: Callable[[_R], bool]) -> None:
            while not enough(run):
                await trio.sleep(sample_every)
            rt.request_stop("stop_when")

        start = trio.current_time()
        with trio.fail_after(limit):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sample_pids)
                if stop_when is not None:
                    nursery.start_soon(stop_once_delivered, stop_when)
                if during is not None:
                    nursery.start_soon(during, rt)
                run.result = await rt.run(**run_kw)
                nursery.cancel_scope.cancel()
        run.elapsed = trio.current_time() - start
        return run

    return trio.run(main)
