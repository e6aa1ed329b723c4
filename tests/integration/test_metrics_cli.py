"""Metrics out of ``multilang run`` (docs/OBSERVE.md "Metrics"), as a user
gets them: a real ``multilang run`` process, scraped over HTTP with urllib,
its ``--metrics-file`` read back, and its refusals of bad options.

Synchronisation is on events only: the ``[metrics] serving URL`` line on
stderr, and scrapes repeated until a condition holds (generous overall
timeouts; no wall-clock bound is asserted). The runs are stopped with
SIGTERM once the checks are done (exit 143, summary printed)."""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
COMPONENTS = Path(__file__).resolve().parent / "components"
_SCRIPT = Path(sys.executable).parent / "multilang"
ML = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-c", "from multilang._cli.entry import main; main()"]
TIMEOUT = 60.0  # overall, for any one wait: generous, never reached when things work

needs_ruby_node = pytest.mark.skipif(
    shutil.which("ruby") is None or shutil.which("node") is None, reason="the word count needs ruby and node"
)

COUNTERS = ["multilang_tuples_emitted_total", "multilang_tuples_executed_total", "multilang_tuples_acked_total",
            "multilang_tuples_failed_total", "multilang_process_restarts_total", "multilang_component_errors_total",
            "multilang_trees_completed_total", "multilang_trees_failed_total", "multilang_trees_timed_out_total"]


class Run:
    """``multilang run ...`` in the background; stderr read by a thread."""

    def __init__(self, *args: str, cwd: Path = ROOT) -> None:
        self.proc = subprocess.Popen(ML + list(args), cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._eof = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def wait_for(self, pattern: str) -> re.Match:
        rx = re.compile(pattern)
        found: list[re.Match] = []

        def seen() -> bool:
            found[:] = [m for m in (rx.search(ln) for ln in self.lines) if m][:1]
            return bool(found) or self._eof

        with self._cond:
            self._cond.wait_for(seen, TIMEOUT)
        assert found, f"no line matching {pattern!r} on stderr:\n{''.join(self.lines)}"
        return found[0]

    def stop(self) -> tuple[int, str]:
        """SIGTERM, then the exit status and the whole stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(TIMEOUT)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(TIMEOUT)
        return code, "".join(self.lines)


def scrape(url: str) -> tuple[str, dict]:
    """(content type, {family: {frozenset(labels): value}}) of one GET."""
    with urllib.request.urlopen(url, timeout=10) as r:
        ctype, text = r.headers["Content-Type"], r.read().decode()
    fams: dict[str, dict] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            if line.startswith("# TYPE "):
                fams.setdefault(line.split()[2], {})
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$", line)
        assert m, line
        labels = frozenset(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        fams[m.group(1)][labels] = float(m.group(3))
    return ctype, fams


def scrape_until(url: str, cond) -> list[dict]:
    """Scrape until ``cond(families)`` holds; every scrape, oldest first."""
    scrapes = []
    deadline = time.monotonic() + TIMEOUT
    while True:
        ctype, fams = scrape(url)
        assert ctype == "text/plain; version=0.0.4; charset=utf-8"
        scrapes.append(fams)
        if cond(fams):
            return scrapes
        assert time.monotonic() < deadline, f"condition not reached; last scrape: {fams}"
        time.sleep(0.1)


def total(fams: dict, family: str, **want: str) -> float:
    """The sum of a family's samples that have the ``want`` labels."""
    return sum(v for labels, v in fams.get(family, {}).items() if set(want.items()) <= set(labels))


def summary_counts(stderr: str) -> dict[str, dict[str, int]]:
    out = {}
    # (a spout's line has no "executed": it executes nothing)
    for m in re.finditer(r"\[summary\]   (\S+): emitted (\d+), (?:executed (\d+), )?acked (\d+), failed (\d+), "
                         r"restarts (\d+), errors (\d+)", stderr):
        out[m.group(1)] = {k: int(v) for k, v in zip(["emitted", "executed", "acked", "failed", "restarts", "errors"],
                                                     m.groups()[1:]) if v is not None}
    return out


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@needs_ruby_node
def test_a_prometheus_scrape_of_a_running_word_count(tmp_path):
    """The README word count, scraped while it runs: the documented series,
    sensible values, counters that never go back; its --metrics-file's last
    line is the summary."""
    mfile = tmp_path / "metrics.jsonl"
    run = Run("run", "examples/wordcount.toml", "--no-progress", "--duration", "600", "--metrics-port", "0",
              "--metrics-file", str(mfile), "-c", "topology.builtin.metrics.bucket.size.secs=0.2")
    try:
        url = run.wait_for(r"\[metrics\] serving (http://127\.0\.0\.1:\d+/metrics)").group(1)
        scrapes = scrape_until(url, lambda f: total(f, "multilang_tuples_emitted_total", component="sentences") > 0)
        # ... until every sentence's tree completed (the spout is then exhausted; the run idles until stopped)
        scrapes += scrape_until(url, lambda f: total(f, "multilang_trees_completed_total") == 1080)
        last = scrapes[-1]
    finally:
        code, stderr = run.stop()
    assert code == 143, stderr
    assert "Traceback" not in stderr

    # Counters never go back, across every pair of consecutive scrapes.
    for before, after in zip(scrapes, scrapes[1:]):
        for name in COUNTERS:
            for labels, v in before[name].items():
                assert after[name][labels] >= v, (name, labels)

    # The documented series, per task (topology, component, task labels).
    tasks = {"sentences": 1, "split": 2, "count": 2}
    for name in COUNTERS[:6] + ["multilang_tuples_in_flight", "multilang_tuples_queued"]:
        for comp, n in tasks.items():
            series = [ls for ls in last[name] if ("component", comp) in ls]
            assert len(series) == n, (name, comp, last[name])
            assert all({"topology", "component", "task"} == {k for k, _ in ls} for ls in series)
    for name in ["multilang_uptime_seconds", "multilang_trees_in_flight", "multilang_trees_completed_total",
                 "multilang_trees_failed_total", "multilang_trees_timed_out_total"]:
        assert list(last[name]) == [frozenset({("topology", "wordcount")})], name
    # Latencies are over the last 5 to 10 s: some scrape near the end has them.
    assert any(total(f, "multilang_complete_latency_ms", quantile="0.99") > 0 for f in scrapes)
    assert any(total(f, "multilang_execute_latency_ms", component="split", quantile="0.5") > 0 for f in scrapes)
    assert any(0 <= v <= 1 for v in last["multilang_capacity"].values())
    assert ({("topology", "wordcount"), ("component", "count"), ("kind", "bolt"), ("extensions", "batch,state")}
            in [set(ls) for ls in last["multilang_component_info"]])

    # Sensible values once every tree completed.
    assert total(last, "multilang_tuples_emitted_total", component="sentences") == 1080
    assert total(last, "multilang_tuples_acked_total", component="sentences") == 1080
    assert total(last, "multilang_tuples_executed_total", component="split") == 1080
    assert total(last, "multilang_tuples_executed_total", component="count") == \
        total(last, "multilang_tuples_emitted_total", component="split") > 1080
    for comp in tasks:
        assert total(last, "multilang_tuples_acked_total", component=comp) <= \
            max(total(last, "multilang_tuples_emitted_total", component=comp),
                total(last, "multilang_tuples_executed_total", component=comp))
        assert total(last, "multilang_tuples_failed_total", component=comp) == 0
    assert total(last, "multilang_trees_failed_total") == total(last, "multilang_trees_in_flight") == 0
    assert total(last, "multilang_uptime_seconds") > 0

    # The file: JSON lines, time going forward, the last one the summary's counts.
    lines = read_lines(mfile)
    assert len(lines) >= 2
    assert [d["elapsed_s"] for d in lines] == sorted(d["elapsed_s"] for d in lines)
    assert {"ts", "elapsed_s", "topology", "components", "tasks", "trees"} <= set(lines[-1])
    summary = summary_counts(stderr)
    assert set(summary) == set(tasks)
    for comp, counts in summary.items():
        assert {k: lines[-1]["components"][comp][k] for k in counts} == counts, comp
    assert lines[-1]["trees"]["completed"] == 1080
    assert f"trees completed {lines[-1]['trees']['completed']}, failed 0" in stderr


@needs_ruby_node
def test_a_scrape_on_workers_reads_the_runs_series_before_the_first_interval_is_over(tmp_path):
    """On host workers a scrape reads the run's last snapshot merged from
    the workers' parts. The first is taken as soon as every worker answers;
    a trial's scrapes read an uptime of 0 and no task's series for the
    first interval (2 s). With a 120 s interval (the metrics file's), only
    that first snapshot can be read here."""
    run = Run("run", "examples/wordcount.toml", "--workers", "2", "--no-progress", "--duration", "600",
              "--metrics-port", "0", "--metrics-file", str(tmp_path / "metrics.jsonl"),
              "-c", "topology.builtin.metrics.bucket.size.secs=120")
    try:
        url = run.wait_for(r"\[metrics\] serving (http://127\.0\.0\.1:\d+/metrics)").group(1)
        last = scrape_until(url, lambda f: total(f, "multilang_uptime_seconds") > 0)[-1]
    finally:
        code, stderr = run.stop()
    assert code == 143, stderr
    for comp, n in {"sentences": 1, "split": 2, "count": 2}.items():
        assert len([ls for ls in last["multilang_tuples_emitted_total"] if ("component", comp) in ls]) == n, last


def test_metrics_frames_of_a_component_and_consumers_from_the_conf(tmp_path):
    """A bolt's `metrics` commands become multilang_component_metric series
    per task (numbers and flattened dicts; strings only in the JSON lines),
    with the consumers declared in the topology's conf."""
    mfile = tmp_path / "m.jsonl"
    topo = tmp_path / "t.toml"
    topo.write_text(f"""
[topology]
name = "mt"

[topology.conf]
"topology.metrics.consumer.register" = [
  {{ class = "prometheus", argument = 0 }},
  {{ class = "json", argument = {json.dumps(str(mfile))} }},
]
"topology.builtin.metrics.bucket.size.secs" = 0.2

[spouts.s]
command = ["python", {json.dumps(str(EXAMPLES / "python" / "sentence_spout.py"))},
           {json.dumps(str(EXAMPLES / "data" / "alice.txt"))}]
fields = ["sentence"]

[bolts.m]
command = ["python", {json.dumps(str(COMPONENTS / "metrics_bolt.py"))}]
fields = ["x"]
parallelism = 2
inputs = [{{ source = "s", grouping = "shuffle" }}]
""")

    def seen(f) -> float:
        return total(f, "multilang_component_metric", component="m", name="seen", key="")

    run = Run("run", str(topo), "--no-progress", "--duration", "600")
    try:
        url = run.wait_for(r"\[metrics\] serving (http://127\.0\.0\.1:\d+/metrics)").group(1)
        last = scrape_until(url, lambda f: total(f, "multilang_trees_completed_total") == 1080 and seen(f) == 1080)[-1]
    finally:
        code, stderr = run.stop()
    assert code == 143, stderr
    assert "Traceback" not in stderr and "restarts 0, errors 0" in stderr

    by_task = {dict(ls)["task"]: v for ls, v in last["multilang_component_metric"].items()
               if ("name", "seen") in ls}
    assert len(by_task) == 2 and sum(by_task.values()) == 1080  # each process counts what it saw
    metric = {(dict(ls)["name"], dict(ls)["key"]) for ls in last["multilang_component_metric"]}
    assert metric == {("seen", ""), ("lat", "p50"), ("lat", "nested.x")}  # "note" and "label" are strings
    assert total(last, "multilang_component_metric", name="lat", key="nested.x") == 4  # 2 per task

    lines = read_lines(mfile)
    final = lines[-1]
    assert {t["metrics"]["note"] for t in final["tasks"].values() if t["component"] == "m"} == {"a string"}
    assert sum(t["metrics"]["seen"] for t in final["tasks"].values() if t["component"] == "m") == 1080
    assert summary_counts(stderr)["m"]["executed"] == final["components"]["m"]["executed"] == 1080


# --- refusals: exit 2, a message naming the option, no traceback, nothing started -------------------


def multilang(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(ML + list(args), cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)


def _refused(r: subprocess.CompletedProcess, *said: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    for s in said:
        assert s in r.stderr, r.stderr
    assert "[summary]" not in r.stderr  # nothing ran


def test_bad_metrics_options_are_usage_errors(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        _refused(multilang("run", "examples/wordcount.toml", "--metrics-port", str(port)),
                 f"error: --metrics-port {port}: cannot listen on 127.0.0.1:{port}: Address already in use")
    _refused(multilang("run", "examples/wordcount.toml", "--metrics-port", "70000"),
             "Invalid value for '--metrics-port'", "70000 is not in the range 0<=x<=65535")
    _refused(multilang("run", "examples/wordcount.toml", "--metrics-port", "http"), "Invalid value for '--metrics-port'")
    _refused(multilang("run", "examples/wordcount.toml", "--metrics-file", str(tmp_path / "no" / "m.jsonl")),
             f"error: --metrics-file {tmp_path / 'no' / 'm.jsonl'}: No such file or directory")
    _refused(multilang("run", "examples/wordcount.toml", "--metrics-file", str(tmp_path)),
             "Invalid value for '--metrics-file'")
    _refused(multilang("run", "examples/wordcount.toml", "--metrics-host", "0.0.0.0"),
             "--metrics-host applies with --metrics-port")
    _refused(multilang("run", "examples/wordcount.toml", "--metrics-port", "0", "--metrics-host", "no.such.host.invalid"),
             "error: --metrics-port: host 'no.such.host.invalid'")
    _refused(multilang("run", "examples/wordcount.toml", "-c",
                       'topology.metrics.consumer.register=[{"class": "LoggingMetricsConsumer", "argument": 1}]'),
             "conf key 'topology.metrics.consumer.register' must be a list of tables")
    _refused(multilang("run", "examples/wordcount.toml", "--engine", "spark", "--metrics-port", "0"),
             "--metrics-file and --metrics-port apply to the embedded engine")
