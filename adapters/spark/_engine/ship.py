"""Components shipped to the executors: the folder a topology's commands
run in, packed as one archive together with the Ruby and Node component
libraries, handed to Spark (``SparkContext.addArchive``, or
``addArtifacts(archive=True)`` under Spark Connect), and found again on
each executor in its SparkFiles directory. Every master takes this one
path, local ones included, so a job that runs on ``local[*]`` finds its
scripts the same way on a cluster whose workers see none of the driver's
folders (docs/DEPLOY.md).

The archive's name carries a digest of what it holds: Spark refuses a
second archive of one name with other contents, and an unchanged folder
is packed once per driver process.
"""

from __future__ import annotations

import atexit
import glob
import hashlib
import io
import os
import shutil
import socket
import stat
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Sequence

from multilang import library_path
from multilang.errors import TopologyError
from multilang.shellbolt import scratch_folder

__all__ = ["LIBS", "MAX_BYTES", "pack", "ship", "unpacked", "with_libraries", "executor_name"]

#: the folder of the archive that holds our component libraries (ruby/multilang.rb, node/multilang.js)
LIBS = ".multilang-libs"
#: the most a shipped folder may hold: every executor fetches and unpacks it
MAX_BYTES = 512 << 20
#: folders never shipped: version control and caches, which no command reads
_SKIP = frozenset({".git", ".hg", ".svn", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis"})

_packed: dict[tuple[str, tuple[str, ...]], tuple[tuple[Any, ...], str, str]] = {}
_shipped: set[tuple[int, str]] = set()
_tmp: list[str] = []


def executor_name() -> str:
    """This machine, as an error on the driver names the executor it came from."""
    return socket.gethostname()


def _files(folder: Path, exclude: Sequence[str]) -> list[tuple[Path, os.stat_result]]:
    """The regular files under ``folder``, through symbolic links (what a
    command there reads: the executor gets their contents), sorted."""
    skip = {os.path.realpath(e) for e in exclude}
    seen = {os.path.realpath(folder)}
    out: list[tuple[Path, os.stat_result]] = []
    for root, dirs, files in os.walk(folder, followlinks=True):
        keep = []
        for d in sorted(dirs):
            real = os.path.realpath(os.path.join(root, d))
            if d not in _SKIP and real not in skip and real not in seen:  # (a link back up: once)
                seen.add(real)
                keep.append(d)
        dirs[:] = keep
        for name in sorted(files):
            path = Path(root, name)
            try:
                st = path.stat()
            except OSError:
                continue  # gone while walking, or a broken link
            if stat.S_ISREG(st.st_mode):
                out.append((path, st))
    return out


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _libraries() -> list[tuple[str, Path]]:
    found = []
    for lang in ("ruby", "node"):
        try:
            found.append((lang, library_path(lang)))
        except FileNotFoundError:
            pass  # an installation without it: components that need it carry their own copy
    return found


def pack(folder: str | os.PathLike[str], exclude: Sequence[str] = ()) -> tuple[str, str]:
    """The archive of ``folder`` (its files, and our libraries under
    :data:`LIBS`), as ``(path, name)``; ``exclude``: folders inside it that
    are not shipped (a checkpoint directory). TopologyError if the folder
    is missing or holds more than :data:`MAX_BYTES`."""
    root = Path(folder).resolve()
    if not root.is_dir():
        raise TopologyError(f"the folder to ship to the executors, {root}, "
                            f"{'is not a directory' if root.exists() else 'does not exist'}")
    files = _files(root, exclude)
    total = sum(st.st_size for _, st in files)
    if total > MAX_BYTES:
        biggest = sorted(((st.st_size, p) for p, st in files), reverse=True)[:3]
        names = ", ".join(f"{p.relative_to(root)} ({_mib(size)})" for size, p in biggest)
        raise TopologyError(
            f"{root} holds {_mib(total)}, more than the {_mib(MAX_BYTES)} shipped to every executor "
            f"(largest: {names}). Commands run in this folder (the topology file's, or resource_dir, whose "
            "default is the working directory): keep the components and what they read in a folder of their own")
    libs = _libraries()
    signature = tuple((str(p), st.st_size, st.st_mtime_ns, st.st_mode) for p, st in files) + tuple(
        (str(p), p.stat().st_mtime_ns) for _, p in libs)
    key = (str(root), tuple(sorted(os.path.realpath(e) for e in exclude)))
    cached = _packed.get(key)
    if cached is not None and cached[0] == signature and os.path.exists(cached[1]):
        return cached[1], cached[2]
    # One read of each file: the archive holds the bytes its name's digest covers, even where a file
    # changes while it is packed (tar.add would stat and read it again, and fail on one that shrank).
    if not _tmp:
        _tmp.append(scratch_folder("multilang-ship-"))
        atexit.register(shutil.rmtree, _tmp[0], True)
    fd, part = tempfile.mkstemp(suffix=".part", dir=_tmp[0])
    os.close(fd)
    try:
        digest = _write(part, root, files, libs)
    except BaseException:
        os.unlink(part)
        raise
    base = "".join(c if c.isalnum() or c in "-_" else "_" for c in root.name) or "root"
    name = f"multilang-{base}-{digest.hexdigest()[:16]}.tgz"
    path = os.path.join(_tmp[0], name)
    os.replace(part, path)
    _packed[key] = (signature, path, name)
    return path, name


def _write(part: str, root: Path, files: list[tuple[Path, os.stat_result]], libs: list[tuple[str, Path]]) -> Any:
    """Archive ``files`` and ``libs`` at ``part``; the digest of what it holds."""
    digest = hashlib.sha256()
    with tarfile.open(part, "w:gz", compresslevel=1) as tar:
        for p, st in files:
            try:
                data = p.read_bytes()
            except FileNotFoundError:
                continue  # gone since the walk (a temporary file, a rotated log): not shipped
            arcname = str(p.relative_to(root))
            digest.update(arcname.encode() + b"\0" + oct(st.st_mode).encode() + b"\0")
            digest.update(data)
            _add(tar, arcname, data, st)
        for lang, p in libs:
            data = p.read_bytes()
            digest.update(lang.encode() + b"\0" + data)
            _add(tar, f"{LIBS}/{lang}/{p.name}", data, p.stat())
    return digest


def _add(tar: tarfile.TarFile, arcname: str, data: bytes, st: os.stat_result) -> None:
    info = tarfile.TarInfo(arcname)
    info.size, info.mode, info.mtime = len(data), stat.S_IMODE(st.st_mode), int(st.st_mtime)
    tar.addfile(info, io.BytesIO(data))


def ship(spark: Any, folder: str | os.PathLike[str], exclude: Sequence[str] = ()) -> str:
    """Pack ``folder`` (:func:`pack`) and hand it to the executors of
    ``spark`` (a SparkSession, classic or Connect, or a SparkContext), once
    per session; returns the archive's name (:func:`unpacked` finds it on
    an executor)."""
    path, name = pack(folder, exclude)
    key = (id(spark), name)
    if key not in _shipped:
        if hasattr(spark, "addArchive"):  # a SparkContext
            spark.addArchive(path)
        else:
            try:
                sc = spark.sparkContext  # a classic session
            except Exception:  # noqa: BLE001 - Spark Connect has no SparkContext: its artifacts instead
                spark.addArtifacts(path, archive=True)
            else:
                sc.addArchive(path)
        _shipped.add(key)
    return name


def unpacked(name: str) -> str:
    """On an executor: the folder the archive ``name`` was unpacked into."""
    from pyspark import SparkFiles

    where = os.path.abspath(SparkFiles.get(name))
    if os.path.isdir(where):
        return where
    # Under Spark Connect a session's artifacts are in a folder of its own under the application's
    # files, and a streaming query's Python workers (a spout's runner, a micro-batch's tasks) may get
    # another ("streaming_job"): the archive is then in a sibling folder, or one level up. (Its name
    # carries its contents' digest: any copy found is the one shipped.)
    root = os.path.dirname(where)
    for files in (root, os.path.dirname(root)):
        for found in [os.path.join(files, name), *sorted(glob.glob(os.path.join(glob.escape(files), "*", name)))]:
            if os.path.isdir(found):
                return found
    raise TopologyError(f"on executor {executor_name()}: the components shipped as {name} are not in {where}; "
                        "was the archive removed from the executor's work directory?")


def with_libraries(root: str, env: dict[str, str] | None) -> dict[str, str]:
    """``env`` for a command run in a shipped folder: our Ruby and Node
    libraries found by name (``require 'multilang'``, ``require('multilang')``)
    after what the user set."""
    out = dict(env or {})
    for var, lang in (("RUBYLIB", "ruby"), ("NODE_PATH", "node")):
        lib = os.path.join(root, LIBS, lang)
        if os.path.isdir(lib):
            before = out.get(var, os.environ.get(var, ""))
            out[var] = f"{before}{os.pathsep}{lib}" if before else lib
    return out
