"""The replay log of the multilang streaming source: every tuple taken from
the spout gets a durable position, so a micro-batch Spark re-runs gets the
same rows in the same order (docs/SPARK.md, "Offsets, replay log, commit").
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from multilang.codec import dumps, loads

log = logging.getLogger("multilang.spark.source")

_LOG_VERSION = 1


def _id_key(msg_id: Any) -> str:
    """Canonical JSON of a message id: JSON types kept apart (1, 1.0, "1", true)."""
    return json.dumps(msg_id, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class _ReplayLog:
    """Positions -> records, one JSON-lines file per appended chunk.

    Layout of the directory::

        meta.json          {"version": 1, "log": <uuid>}
        committed.json     {"pos": n}: every position < n is committed (acked)
        batch-<a>-<b>.jsonl  positions a..b-1, one {"id", "values"} per line
        acked-ids.jsonl    (dedupe=all) one JSON array of ids per commit
        lock               flock'ed by the one reader using the log
    """

    def __init__(self, directory: str | None, keep_ids: bool) -> None:
        self.temporary = directory is None
        if directory is None:
            directory = tempfile.mkdtemp(prefix="multilang-replay-")
            log.warning(
                "multilang source: no replayLog option; using the temporary %s. A restarted query "
                "cannot replay its uncommitted batches from it: set replayLog to a durable directory "
                "next to the query's checkpoint.", directory,
            )
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd: int | None = self._lock()
        try:
            self._load(keep_ids)
        except BaseException:
            self.close()
            raise

    def _load(self, keep_ids: bool) -> None:
        meta_path = self.dir / "meta.json"
        if meta_path.exists():
            meta = json.loads(meta_path.read_text())
            if meta.get("version") != _LOG_VERSION:
                raise RuntimeError(f"replay log {self.dir}: unknown version {meta.get('version')!r}")
        else:
            meta = {"version": _LOG_VERSION, "log": str(uuid.uuid4())}
            self._write_atomic(meta_path, json.dumps(meta).encode())
        self.id: str = meta["log"]
        committed = self.dir / "committed.json"
        self.committed = int(json.loads(committed.read_text())["pos"]) if committed.exists() else 0
        self.chunks: list[tuple[int, int, Path]] = []
        for p in self.dir.glob("batch-*.jsonl"):
            a, b = p.stem.split("-")[1:3]
            self.chunks.append((int(a), int(b), p))
        self.chunks.sort()
        self.end = self.committed
        live = []
        for a, b, p in self.chunks:
            if b <= self.committed:  # committed, left behind by a crash before its deletion
                p.unlink(missing_ok=True)
                continue
            if a > self.end:
                raise RuntimeError(f"replay log {self.dir} has a gap: positions {self.end}..{a} are missing")
            live.append((a, b, p))
            self.end = b
        self.chunks = live
        self.acked_ids: set[str] = set()
        self._keep_ids = keep_ids
        ids_path = self.dir / "acked-ids.jsonl"
        if keep_ids and ids_path.exists():
            for line in ids_path.read_text().splitlines():
                if line.strip():
                    self.acked_ids.update(_id_key(i) for i in loads(line.encode()))

    def _lock(self) -> int:
        fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + 30
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() > deadline:  # the previous run's worker had 30s to exit
                    os.close(fd)
                    raise RuntimeError(
                        f"replay log {self.dir} is in use by another running query; "
                        "give each query its own replayLog directory"
                    ) from None
                time.sleep(0.1)

    def _write_atomic(self, path: Path, data: bytes) -> None:
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def append(self, records: list[tuple[Any, list[Any]]]) -> tuple[int, int]:
        """Durably append records (msg id, values); returns their positions."""
        a, b = self.end, self.end + len(records)
        body = b"".join(dumps({"id": i, "values": v}) + b"\n" for i, v in records)
        path = self.dir / f"batch-{a:012d}-{b:012d}.jsonl"
        self._write_atomic(path, body)
        self.chunks.append((a, b, path))
        self.end = b
        return a, b

    def read(self, lo: int, hi: int) -> list[dict[str, Any]]:
        """The records at positions lo..hi-1, exactly as logged."""
        if lo < self.committed or hi > self.end:
            raise RuntimeError(
                f"replay log {self.dir} holds positions {self.committed}..{self.end}, but Spark asks "
                f"for {lo}..{hi}: the log was deleted or belongs to another query"
            )
        out: list[dict[str, Any]] = []
        for a, b, p in self.chunks:
            if b <= lo or a >= hi:
                continue
            lines = p.read_bytes().splitlines()
            if len(lines) != b - a:
                raise RuntimeError(f"replay log file {p} is damaged: {len(lines)} records, expected {b - a}")
            out.extend(loads(line) for line in lines[max(lo - a, 0) : min(hi, b) - a])
        if len(out) != hi - lo:
            raise RuntimeError(f"replay log {self.dir} is missing records in {lo}..{hi}")
        return out

    def mark_committed(self, pos: int, acked: list[Any]) -> None:
        if self._keep_ids and acked:
            with open(self.dir / "acked-ids.jsonl", "ab") as f:
                f.write(dumps(acked) + b"\n")
                f.flush()
                os.fsync(f.fileno())
            self.acked_ids.update(_id_key(i) for i in acked)
        self._write_atomic(self.dir / "committed.json", json.dumps({"pos": pos}).encode())
        self.committed = pos
        keep = []
        for a, b, p in self.chunks:
            if b <= pos:
                try:
                    p.unlink()
                except FileNotFoundError:
                    pass
            else:
                keep.append((a, b, p))
        self.chunks = keep

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None
        if self.temporary:
            shutil.rmtree(self.dir, ignore_errors=True)
