"""A real Spark standalone cluster on 127.0.0.1 for the tests: a master and
workers started with the commands of docs/DEPLOY.md's standalone section
(pyspark's own launcher, ``bin/spark-class``), on free ports, each worker
with its own work directory and, where the machine allows it (root, or
user namespaces), in a mount namespace of its own in which a folder of the
driver's (``hidden``) is an empty tmpfs: what runs on the workers sees none
of what the driver put there, as on a cluster of several machines."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

SPARK_HOME = Path(pyspark.__file__).parent
SPARK_CLASS = str(SPARK_HOME / "bin" / "spark-class")
ENV = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "PYSPARK_PYTHON": sys.executable,
       "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
#: how a worker starts with ``hidden`` out of its sight
_HIDE = 'mount -t tmpfs tmpfs "$1" && shift && exec "$@"'
DEPLOY = Path(__file__).resolve().parents[2] / "docs" / "DEPLOY.md"


def deploy_commands() -> dict[str, list[str]]:
    """The standalone commands of docs/DEPLOY.md (the block after its
    ``<!-- checked: standalone`` mark), as argv: ``master``, ``worker`` (the
    first worker line) and ``run``, with ``$SPARK_HOME/bin/spark-class``
    made this pyspark's and the trailing ``&`` dropped."""
    text = DEPLOY.read_text()
    block = text[text.index("<!-- checked: standalone"):]
    block = block[block.index("```bash\n") + 8:]
    block = block[:block.index("```")]
    found: dict[str, list[str]] = {}
    for line in block.splitlines():
        argv = [a for a in shlex.split(line) if a != "&"]
        if not argv:
            continue
        if argv[0] == "$SPARK_HOME/bin/spark-class":
            argv[0] = SPARK_CLASS
            kind = "master" if argv[1].endswith(".Master") else "worker"
            found.setdefault(kind, argv)
        elif argv[0] == "multilang":
            found["run"] = argv
    assert set(found) == {"master", "worker", "run"}, f"docs/DEPLOY.md's standalone block lacks a command: {found}"
    return found


def _set(argv: list[str], flag: str, value: str) -> list[str]:
    """``argv`` with ``flag``'s value replaced, or the flag added."""
    out = list(argv)
    if flag in out:
        out[out.index(flag) + 1] = value
    else:
        out += [flag, value]
    return out


def _namespace() -> list[str] | None:
    """The command prefix that gives a process a private mount namespace, or None."""
    if shutil.which("unshare") is None:
        return None
    for prefix in (["unshare", "-m", "--propagation", "private"],
                   ["unshare", "-U", "-r", "-m", "--propagation", "private"]):
        probe = subprocess.run([*prefix, "sh", "-c", "mount -t tmpfs tmpfs /mnt"], capture_output=True)
        if probe.returncode == 0:
            return prefix
    return None


@dataclass
class Standalone:
    url: str
    base: Path  # the workers' work directories are base/worker-N
    hidden: Path
    #: whether the workers really cannot see ``hidden`` (a mount namespace was available)
    isolated: bool
    procs: list[subprocess.Popen] = field(default_factory=list)  # the master first, then the workers
    logs: list[Path] = field(default_factory=list)

    @property
    def workers(self) -> list[subprocess.Popen]:
        return self.procs[1:]

    def sees(self, worker: int, path: Path) -> bool:
        """Whether worker ``worker`` sees ``path`` (through its own root, /proc/PID/root)."""
        return os.path.exists(f"/proc/{self.workers[worker].pid}/root{path}")

    def kill_worker(self, worker: int) -> None:
        """kill -9 a worker and every executor it started (its process group)."""
        _kill(self.workers[worker])

    def stop(self) -> None:
        for proc in reversed(self.procs):
            _kill(proc)

    def log_text(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.logs if p.exists())


def _kill(proc: subprocess.Popen) -> None:
    """kill -9 a process and its process group (a worker's executors), and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _wait_for(path: Path, pattern: str, proc: subprocess.Popen, timeout: float) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(pattern, path.read_text(errors="replace")) if path.exists() else None
        if m:
            return m
        if proc.poll() is not None:
            raise RuntimeError(f"{path.name}: the process exited ({proc.returncode}):\n{path.read_text()[-3000:]}")
        time.sleep(0.2)
    raise RuntimeError(f"{path.name}: no {pattern!r} within {timeout}s:\n{path.read_text()[-3000:]}")


def start(base: Path, hidden: Path, n_workers: int = 2, timeout: float = 90.0) -> Standalone:
    """A master and ``n_workers`` workers on 127.0.0.1, as docs/DEPLOY.md
    starts them; ``hidden``, a folder of the driver's, is out of the
    workers' sight."""
    hidden.mkdir(parents=True, exist_ok=True)
    props = base / "spark-defaults.conf"
    props.write_text("spark.master.rest.enabled false\nspark.worker.cleanup.enabled false\n")
    prefix = _namespace()
    cluster = Standalone("", base, hidden, prefix is not None)
    docs = deploy_commands()
    try:
        log = base / "master.log"
        cluster.logs.append(log)
        argv = _set(_set(_set(docs["master"], "--port", "0"), "--webui-port", "0"), "--properties-file", str(props))
        cluster.procs.append(subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, env=ENV,
                                              start_new_session=True))
        m = _wait_for(log, r"Starting Spark master at (spark://\S+)", cluster.procs[0], timeout)
        cluster.url = m.group(1)
        for i in range(n_workers):
            work = base / f"worker-{i}"
            work.mkdir()
            log = base / f"worker-{i}.log"
            cluster.logs.append(log)
            argv = [cluster.url if a.startswith("spark://") else a for a in docs["worker"]]
            for flag, value in (("--work-dir", str(work)), ("--host", "127.0.0.1"), ("--port", "0"),
                                ("--webui-port", "0"), ("--properties-file", str(props))):
                argv = _set(argv, flag, value)
            if prefix is not None:
                argv = [*prefix, "sh", "-c", _HIDE, "sh", str(hidden), *argv]
            cluster.procs.append(subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, env=ENV,
                                                  start_new_session=True))
        for i, proc in enumerate(cluster.workers):
            _wait_for(base / f"worker-{i}.log", r"Successfully registered with master", proc, timeout)
        return cluster
    except BaseException:
        cluster.stop()
        raise
