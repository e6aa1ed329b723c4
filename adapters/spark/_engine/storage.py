"""Where a Spark run keeps what outlives its processes: the checkpoint
location, named by a URI (``file://``, ``hdfs://``, ``s3a://``, ``gs://``,
``abfs://``) or a local path, and read and written through pyarrow's file
systems, from the driver and the executors alike: never with POSIX calls on
a mount that every machine is assumed to share (docs/DEPLOY.md).

A file is written whole or not at all: on file systems that rename (local,
HDFS) through a temporary name and a rename; on object stores with one put,
which is atomic there.
"""

from __future__ import annotations

import os
import uuid
from typing import Any
from urllib.parse import urlparse

from multilang.errors import TopologyError

__all__ = ["Location"]

#: Hadoop's names of schemes that pyarrow knows by another
_PYARROW_SCHEME = {"s3a": "s3", "s3n": "s3"}


class Location:
    """A folder of a file system: ``Location("s3a://bucket/ck")``,
    ``Location("file:///data/ck")``, ``Location("ck")`` (a local path).
    Paths below it are given as parts (``loc.read("state", "meta.json")``)."""

    def __init__(self, where: str, _fs: Any = None, _root: str | None = None) -> None:
        self.where = where
        scheme = urlparse(where).scheme
        #: given as a URI (``file://`` too), not a path
        self.is_uri = len(scheme) > 1  # (one letter: a Windows drive)
        if _fs is not None:
            self.fs, self.root = _fs, _root or ""
            return
        from pyarrow import fs as pafs

        try:
            if not self.is_uri:
                self.fs, self.root = pafs.LocalFileSystem(), os.path.abspath(where)
            elif scheme == "file":  # as Hadoop reads it: the path is taken literally (no %-escapes)
                self.fs, self.root = pafs.LocalFileSystem(), os.path.abspath(urlparse(where).path or "/")
            else:
                uri = _PYARROW_SCHEME.get(scheme, scheme) + where[len(scheme):]
                self.fs, self.root = pafs.FileSystem.from_uri(uri)
        except (ValueError, OSError, ImportError) as exc:  # an unknown scheme, a file system not built in
            hint = ("; pyarrow reaches HDFS through libhdfs: set JAVA_HOME, ARROW_LIBHDFS_DIR and "
                    "CLASSPATH=$(hadoop classpath --glob) (docs/DEPLOY.md, the checkpoint location)"
                    if scheme in ("hdfs", "viewfs") else "")
            raise TopologyError(f"checkpoint location {where!r}: {exc}{hint}") from None
        self.root = self.root.rstrip("/") or "/"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Location, (self.where, self.fs, self.root))

    @property
    def local(self) -> bool:
        return self.fs.type_name == "local"

    @property
    def uri(self) -> str:
        """The location as Spark names it (``checkpointLocation``, a writer's path)."""
        if self.local:
            return "file://" + self.root  # literal, as Spark's Hadoop paths are (a space stays a space)
        return self.where.rstrip("/")

    def child(self, *parts: str) -> "Location":
        return Location(self.where.rstrip("/") + "/" + "/".join(parts), self.fs, self.path(*parts))

    def path(self, *parts: str) -> str:
        """A path below the location, as its file system names it."""
        return "/".join([self.root.rstrip("/"), *parts]) if parts else self.root

    def spark_path(self, *parts: str) -> str:
        """A path below the location, as Spark names it."""
        return "/".join([self.uri, *parts])

    def exists(self, *parts: str) -> bool:
        from pyarrow import fs as pafs

        return self.fs.get_file_info(self.path(*parts)).type != pafs.FileType.NotFound

    def read(self, *parts: str) -> bytes | None:
        """A file's bytes, or None if there is none."""
        try:
            with self.fs.open_input_stream(self.path(*parts)) as f:
                return f.read()
        except FileNotFoundError:
            return None

    def write(self, data: bytes, *parts: str) -> None:
        """Write a file whole (see the module's docstring)."""
        path = self.path(*parts)
        self.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        if self.fs.type_name not in ("local", "hdfs"):
            with self.fs.open_output_stream(path) as f:
                f.write(data)
            return
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with self.fs.open_output_stream(tmp) as f:
            f.write(data)
        try:
            self.fs.move(tmp, path)  # a local rename replaces the file at once
        except OSError:
            # HDFS renames onto no existing file: the old one goes first. A crash between the
            # two leaves the file missing, never torn (the callers' files are rewritten only by
            # the attempt that owns them).
            self.delete(*parts)
            self.fs.move(tmp, path)

    def list(self, *parts: str) -> list[str]:
        """The names in a folder (none if it does not exist)."""
        from pyarrow import fs as pafs

        infos = self.fs.get_file_info(pafs.FileSelector(self.path(*parts), allow_not_found=True))
        return sorted(i.base_name for i in infos)

    def delete(self, *parts: str) -> None:
        try:
            self.fs.delete_file(self.path(*parts))
        except FileNotFoundError:
            pass

    def delete_all(self) -> None:
        """Remove the location and everything in it."""
        try:
            self.fs.delete_dir(self.root)
        except FileNotFoundError:
            pass

    def __str__(self) -> str:
        return self.where
