"""Where ``multilang run`` and ``multilang pipe`` write their data: stdout
or ``-o FILE`` (written beside FILE and moved over it at the end), in bursts,
stopping quietly when the reader goes away."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import stat
import sys
import tempfile
from typing import IO, Any, Iterator

import orjson

from multilang.shellbolt import owner_gone, owner_tag

from . import signals as _signals

#: the end of a run's hidden file beside -o's FILE
_PARTIAL = ".partial"
#: room for the longest owner tag in its name (scratch.owner_tag: a pid, a start time in clock ticks)
_LONGEST_TAG = "X" * (10 + 1 + 20)


class Output:
    """Where the data goes. When its reader goes away (``| head``) the run
    stops quietly, as Unix tools do, and exits 141 (128 + SIGPIPE)."""

    #: bytes gathered before they are written: one write per burst of
    #: records, not one per record (a text layer's write per line cost more
    #: than the rest of `multilang pipe`'s output path, bench/host_pipe.py)
    LIMIT = 1 << 16

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self._raw: Any = getattr(stream, "buffer", None)  # the byte layer under a text stream
        self._lines: list[bytes] = []
        self._size = 0
        self.closed = False
        self.runtime: Any = None

    def line(self, data: bytes) -> None:
        """One record (bytes, without its newline)."""
        if not self.closed:
            self._lines.append(data)
            self._size += len(data)
            if self._size >= self.LIMIT:
                self._spill()

    def values(self, values: list[Any]) -> None:
        """A bolt's output (``multilang pipe``, once its input's tree
        completed: _pipe_output) as one line: its values in order, its
        declared output fields or any number of values. The per-tuple path:
        :meth:`line` inline."""
        if self.closed:
            return
        try:
            data = orjson.dumps(values)
        except TypeError:  # integers beyond 64 bits: the standard library writes them
            data = json.dumps(values, ensure_ascii=False, separators=(",", ":")).encode()
        self._lines.append(data)
        self._size += len(data)
        if self._size >= self.LIMIT:
            self._spill()

    def _spill(self) -> None:
        lines, self._lines, self._size = self._lines, [], 0
        if lines and not self.closed:
            data = b"\n".join(lines) + b"\n"
            try:
                if self._raw is not None:
                    _write_all(self._raw, data)
                else:
                    self.stream.write(data.decode())
            except BrokenPipeError:
                self._reader_gone()
            except OSError as exc:  # a terminal that hung up (its SIGHUP stops the run): the data goes nowhere
                if not _signals.hung_up(exc):
                    raise

    def flush(self) -> None:
        self._spill()
        if not self.closed:
            try:
                (self._raw or self.stream).flush()
            except BrokenPipeError:
                self._reader_gone()
            except OSError as exc:  # a terminal that hung up (its SIGHUP stops the run): the data goes nowhere
                if not _signals.hung_up(exc):
                    raise

    def _reader_gone(self) -> None:
        import os

        self.closed = True
        try:  # nothing more reaches the closed pipe, not even Python's flush at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())
        except (OSError, ValueError):
            pass
        print("the output's reader went away; stopping", file=sys.stderr)
        if self.runtime is not None:
            self.runtime.request_stop("output closed")


def _write_all(raw: Any, data: bytes) -> None:
    """Write all of ``data`` to a byte stream. Where the stream is a raw
    file (``PYTHONUNBUFFERED=1``, ``python -u``: common in containers) one
    write may take part of it (a signal that comes while a pipe is full:
    a trial's SIGTERM lost the rest of a 66 KB burst, 62 records and half
    of one) or none (a descriptor another process made non-blocking)."""
    view = memoryview(data)
    while view:
        try:
            n = raw.write(view)
        except BlockingIOError as exc:  # (a buffered layer over a non-blocking descriptor)
            n = exc.characters_written
        if n:
            view = view[n:]
        else:  # it takes nothing now: wait until it can
            select.select([], [raw.fileno()], [])


class NoOutput(SystemExit):
    """The run ended without writing its output (a signal during Spark's
    start-up, a Spark job that failed: the Spark engine writes the output
    view at the end): FILE of ``-o`` is left as it was."""


@contextlib.contextmanager
def output_file(path: str, refused: int, failed: int) -> Iterator[IO[str]]:
    """``-o FILE``: the run writes a hidden file beside FILE, moved over FILE
    when the run ends (its output so far, after a signal too). A run refused
    (SystemExit with code ``refused``), one that wrote no output
    (:class:`NoOutput`), or a host that crashes, leaves FILE as it was: never empty
    or half-written in place of the old one. A run that ended well whose
    hidden file could not be moved (a full disk) exits ``failed``. ``-`` is stdout. A FILE that is
    not a regular file (``/dev/null``, ``/dev/stdout``, a named pipe) is
    written as the output comes: it is never replaced (a device node made a
    plain file, as root could). A link to a file: the file is replaced, the
    link kept."""
    if path == "-":
        yield sys.stdout
        return
    target = os.path.abspath(path)
    try:
        special = not stat.S_ISREG(os.stat(target).st_mode)
    except OSError:  # (not there yet: made beside, as below)
        special = False
    if special:
        try:
            stream = open(target, "w", encoding="utf-8")  # noqa: SIM115 - closed below, after the run
        except OSError as exc:
            print(f"error: --output {path}: {exc.strerror or exc}", file=sys.stderr)
            raise SystemExit(refused) from None
        try:
            yield stream
        finally:
            with contextlib.suppress(OSError):
                stream.close()
        return
    target = os.path.realpath(target)
    folder, name, tag = os.path.dirname(target), os.path.basename(target), owner_tag()
    most = _longest_name(folder)
    if len(os.fsencode(name)) > most:  # (refused now: found only at the end, the run's output would be lost)
        print(f"error: --output {path}: File name too long ({len(os.fsencode(name))} bytes; the folder takes at "
              f"most {most})", file=sys.stderr)
        raise SystemExit(refused)
    prefix = _hidden_prefix(name, most)
    _remove_orphans(folder, prefix)
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f"{prefix}{tag}.", suffix=_PARTIAL)
    except OSError as exc:
        print(f"error: --output {path}: {exc.strerror or exc}", file=sys.stderr)
        raise SystemExit(refused) from None
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)  # as open() would have made it, not mkstemp's 0600
    stream = os.fdopen(fd, "w", encoding="utf-8")

    def finish(keep: bool) -> bool:
        """Close the hidden file, and move it over FILE (``keep``) or remove it; False: it could not be moved."""
        try:
            stream.close()
            if keep:
                os.replace(tmp, target)
        except OSError as exc:  # a full disk, say: FILE keeps its old contents
            print(f"error: --output {path}: {exc.strerror or exc}; what was written is in {tmp} (the next run "
                  f"writing {path} removes it)", file=sys.stderr)
            return False
        finally:
            if not keep:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        return True

    try:
        yield stream
    except SystemExit as exc:
        keep = exc.code != refused and not isinstance(exc, NoOutput)
        if not finish(keep) and exc.code in (0, None):  # (a run that ended well, its output not where asked)
            raise SystemExit(failed) from None
        raise
    except BaseException:
        finish(False)
        raise
    if not finish(True):
        raise SystemExit(failed)


def _longest_name(folder: str) -> int:
    """The longest file name ``folder`` takes, in bytes."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def _hidden_prefix(name: str, most: int) -> str:
    """``.FILE.``, the start of the hidden file's name, the same for every
    run writing FILE: where the whole name (``.FILE.TAG.XXXXXXXX.partial``,
    TAG as long as it can be) would be longer than the folder takes, FILE
    is cut short and a hash of it added, so that another FILE whose name
    starts the same way gets another prefix (a FILE of 230 characters, which
    the folder takes, was refused)."""
    room = max(most - len(f"..{_LONGEST_TAG}.XXXXXXXX{_PARTIAL}"), 10)  # (mkstemp's 8 characters)
    raw = os.fsencode(name)
    if len(raw) <= room:
        return f".{name}."
    return f".{os.fsdecode(raw[:room - 9])}~{hashlib.sha1(raw).hexdigest()[:8]}."


def _remove_orphans(folder: str, prefix: str) -> None:
    """Remove the hidden files of earlier runs writing the same FILE whose
    process has ended without moving or removing its own (kill -9): each
    names its owner (``.FILE.PID-STARTED.XXXX.partial``). Another run's
    still writing is left alone, as is a file that names no owner."""
    uid = os.getuid()
    try:
        entries = [e for e in os.scandir(folder) if e.name.startswith(prefix) and e.name.endswith(_PARTIAL)]
    except OSError:
        return
    for e in entries:
        tag = e.name[len(prefix):-len(_PARTIAL)].rpartition(".")[0]
        with contextlib.suppress(OSError):
            if e.is_file(follow_symlinks=False) and e.stat(follow_symlinks=False).st_uid == uid and owner_gone(tag):
                os.unlink(e.path)


async def flush_every(stream: Any, interval: float = 0.2) -> None:
    """Outputs reach a pipe as they come (within ``interval``), not at the
    end, without a write call per tuple."""
    import trio

    while True:
        await trio.sleep(interval)
        stream.flush()
