"""Where ``multilang run`` and ``multilang pipe`` write their data: stdout
or ``-o FILE`` (written beside FILE and moved over it at the end), in bursts,
stopping quietly when the reader goes away."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import tempfile
from typing import IO, Any, Iterator

import orjson

from multilang.shellbolt import owner_gone, owner_tag

from . import signals as _signals

#: the end of a run's hidden file beside -o's FILE
_PARTIAL = ".partial"


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
                    self._raw.write(data)
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


@contextlib.contextmanager
def output_file(path: str, refused: int) -> Iterator[IO[str]]:
    """``-o FILE``: the run writes a hidden file beside FILE, moved over FILE
    when the run ends (its output so far, after a signal too). A run refused
    (SystemExit with code ``refused``), or a host that crashes, leaves FILE as it was: never empty
    or half-written in place of the old one. ``-`` is stdout. A FILE that is
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
    folder, tag = os.path.dirname(target), owner_tag()
    prefix = _hidden_prefix(folder, os.path.basename(target), tag)
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
    keep = False
    try:
        yield stream
        keep = True
    except SystemExit as exc:
        keep = exc.code != refused
        raise
    finally:
        try:
            stream.close()
            if keep:
                os.replace(tmp, target)
        except OSError as exc:  # a full disk, say: FILE keeps its old contents
            print(f"error: --output {path}: {exc.strerror or exc}; what was written is in {tmp} (the next run "
                  f"writing {path} removes it)", file=sys.stderr)
        if not keep:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _hidden_prefix(folder: str, name: str, tag: str) -> str:
    """``.FILE.``, the start of the hidden file's name: FILE cut short where
    the whole name (``.FILE.TAG.XXXXXXXX.partial``) would be longer than the
    folder allows (a FILE of 230 characters, which the folder takes, was
    refused)."""
    try:
        most = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        most = 255
    room = most - len(os.fsencode(f"..{tag}.XXXXXXXX{_PARTIAL}"))  # (mkstemp's 8 characters)
    raw = os.fsencode(name)
    return f".{os.fsdecode(raw[:room]) if len(raw) > room else name}."


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
