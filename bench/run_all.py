#!/usr/bin/env python
"""The whole performance suite in one command: one table of same-run ratios.

    python bench/run_all.py [--quick] [--repeat R] [--no-spark] [--json FILE]

Everything is measured in this run, on this machine, and every ratio divides
two numbers from this run. Within each section the variants are interleaved
round-robin (variant A run 1, B run 1, ..., A run 2, ...) so background load
hits them alike; every variant first runs once untimed as a warm-up whose
output is checked in full, then R timed runs, and the best run counts.

Sections
--------
1. Bolts under the plain-bytes driver (bench/bolt_throughput.py's ``drive``:
   pre-encoded frames written by a thread, stdout read in 1 MiB reads, frames
   and acks counted from the raw bytes, no parsing), workloads ``echo``
   (["word", n] -> 1 anchored emit + ack) and ``split`` (a 5-word sentence ->
   5 anchored emits + ack):

   * Python: our library (bench/components/ours_*.py) standard and batched,
     pystorm (standard only: it does not know the extension);
   * Ruby and Node: echo = bench/components/{ruby_echo.rb,node_echo.js},
     split = examples/{ruby,node}/split_bolt.*, standard and batched;
   * batched = the driver offers ``"extensions": ["batch"]`` in the
     handshake (§9.1), requires the pid reply to accept it, and sends
     ``{"tuples": [...]}`` frames of ``--batch`` (100) tuples; acks are
     counted from the raw bytes of the ``"acks":[...]`` arrays;
   * msgpack (spec §9.6): the driver offers ``["msgpack"]`` (standard frames)
     or ``["batch", "msgpack"]`` (batches of ``--batch``), sends the tuples
     as length-prefixed msgpack frames and requires the pid reply to accept
     every offered extension (else the row FAILS: "offered but not
     accepted"); counts come from walking the length prefixes and the
     msgpack bytes of the command values / the batch arrays' headers
     (bench/bolt_throughput.py); python ours, ruby and node, echo and split;
   * python, ours batch API: bench/components/ours_echo_batch.py
     (``Bolt.process_batch``), echo only, batched JSON and msgpack+batch;
   * the driver's own ceiling: ``cat`` replaying a correct reply stream
     (standard, batched, msgpack, msgpack+batch), which must be well above
     the fastest bolt of its mode.

   A row whose run fails (warm-up check, a refused extension, a crash) is
   shown as FAILED, its error printed at the end, the exit status is 1, and
   the other rows go on.

2. Our host: the same Python bolt in a one-bolt topology on
   ``multilang.shellbolt.Runtime``, fed by an in-process ``PythonSpout`` of
   the same pre-built tuples, acking on (every tuple a tracked root, its tree
   completed by the bolt's ack), host defaults otherwise
   (``topology.shellbolt.max.pending`` 100); standard (``multilang.extensions
   = []``), batched (``["batch"]``) and msgpack+batched (``["batch",
   "msgpack"]``). Timed from the first output tuple
   to the last (process start and handshake excluded, as in the driver);
   the run must complete every tree.

3. Spark (bench/spark_pipe.py, run as a subprocess with its own options and
   its output read back): the example split bolt (``split``, 20,000 lines,
   ~24 records per line) and a one-record-per-line bolt (``line``, 100,000
   lines: ``RDD.pipe`` is mostly fixed job cost below that) in ``mapInArrow``
   with acking, standard and batched, vs ``RDD.pipe`` with an equivalent
   line-oriented Python script over the same cached data, variants
   interleaved, best of R. ``--quick``: split only, 2,000 lines, R = 1 (job
   overheads dominate there: not comparable with the full run).

4. The word-count topology (examples/wordcount.toml: Python spout, Ruby
   split x2, Node count x2) with ``multilang run`` on the embedded engine and
   with ``--engine spark``; sentences/s and words/s from each run's own
   ``[summary]`` time (Spark's includes starting the SparkSession). Embedded:
   best of R; Spark: one run (not with ``--quick``).

Targets (printed MET / NOT MET): standard host + Python echo >= 0.8x the
driver with the same bolt; batched >= 4x standard on the Python echo, and
the same for the batch-API echo (process_batch, batched) over our standard
echo; >= 2x on the Ruby and Node echo; Spark batched with acking >= 1.0x RDD.pipe
(stretch 2x). The driver ceiling must be >= 1.5x the fastest bolt of each
mode, else the bolt numbers are flagged.

Default run < 10 minutes, ``--quick`` < 2 minutes (smaller N, R = 2, small
Spark data, no Spark word count) on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EXAMPLES = ROOT / "examples"
COMPONENTS = HERE / "components"
sys.path.insert(0, str(HERE))

import bolt_throughput as bt  # noqa: E402

PY = sys.executable


# --- rows --------------------------------------------------------------------------


@dataclass
class Row:
    """One variant: how to run it once, and its measurements."""

    key: str  # e.g. "py.std", "host.batch", "cat.batch"
    label: str
    n: int
    run: Callable[[bool], float]  # run(warmup) -> tuples/s
    rates: list[float] = field(default_factory=list)
    error: str | None = None  # set when a run failed; the row is then not run again

    @property
    def best(self) -> float:
        return max(self.rates) if self.rates and not self.error else float("nan")


def driver_row(key: str, label: str, cmd: list[str], wl: bt.Workload, ok: tuple[int, ...] = (0,)) -> Row:
    def run(warmup: bool) -> float:
        return bt.drive(cmd, wl, verify=warmup, ok_codes=ok).rate

    return Row(key, label, wl.n, run)


def host_row(key: str, label: str, cmd: list[str], wl: bt.Workload, extensions: list[str]) -> Row:
    """Our host: PythonSpout(pre-built tuples) -> ShellBolt(cmd), acking on."""
    import trio

    from multilang.shellbolt import PythonSpout, Runtime, ShellBolt, TopologyBuilder

    in_fields = ["word", "count"] if wl.kind == "echo" else ["sentence"]
    out_fields = ["word", "count"] if wl.kind == "echo" else ["word"]

    def run(warmup: bool) -> float:
        b = TopologyBuilder()
        b.set_spout("spout", PythonSpout(wl.values, fields=in_fields))
        b.set_bolt("bolt", ShellBolt(cmd, fields=out_fields)).shuffle_grouping("spout")
        topo = b.create_topology({"multilang.extensions": extensions}, name="bench-host", resource_dir=str(HERE))
        seen: list[list] | None = [] if warmup else None
        count = 0
        t_first = t_last = 0.0
        clock = time.perf_counter

        def on_output(component: str, stream: str, values: list, roots: list) -> None:
            nonlocal count, t_first, t_last
            count += 1
            t_last = clock()
            if count == 1:
                t_first = t_last
            if seen is not None:
                seen.append(values)

        rt = Runtime(topo, on_tracked_output=on_output)
        res = trio.run(lambda: rt.run(until_done=True))
        if res.gave_up or res.completed != wl.n or res.failed or res.pending or count != wl.n_emits:
            raise bt.BenchError(f"{label}: {res.completed}/{wl.n} trees completed, {res.failed} failed, "
                                f"{res.pending} pending, {count}/{wl.n_emits} outputs; gave up: {res.gave_up}")
        if seen is not None:
            want = [vals for i in range(wl.n) for vals in wl.expected_emits(i)]
            if [list(v) for v in seen] != want:
                raise bt.BenchError(f"{label}: the bolt's outputs differ from the expected tuples")
        return (wl.n - 1) / (t_last - t_first)  # tuples after the first one's output

    return Row(key, label, wl.n, run)


def measure(rows: list[Row], repeat: int, title: str, errors: list[str]) -> None:
    """Warm-up (checked in full) then ``repeat`` interleaved timed runs. A row
    whose run fails is marked failed (its error goes to ``errors``), is not
    run again and shows as FAILED; the other rows go on."""
    t0 = time.perf_counter()

    def attempt(r: Row, warmup: bool) -> None:
        try:
            rate = r.run(warmup)
        except Exception as exc:  # noqa: BLE001 -- reported below and in the exit status
            r.error = f"{type(exc).__name__}: {exc}"
            errors.append(f"{title}: {r.label} ({'warm-up' if warmup else 'timed run'}): {r.error}")
            print(f"  [{title}] {r.label}: FAILED: {str(exc).splitlines()[0][:300]}", file=sys.stderr, flush=True)
        else:
            if not warmup:
                r.rates.append(rate)

    for r in rows:  # warm-up, checked in full
        attempt(r, True)
    for _ in range(repeat):
        for r in rows:
            if not r.error:
                attempt(r, False)
    print(f"  [{title}] {len(rows)} variants x (1 checked warm-up + {repeat} timed), "
          f"{time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)


# --- section 1 + 2: bolts -------------------------------------------------------


def bolt_rows(kind: str, scale: float, batch: int, tmp: str) -> list[Row]:
    """All variants of one workload, sized so each timed run lasts ~0.3-1.5 s."""

    def n(x: int) -> int:
        x = int(x * scale) if kind == "echo" else int(x * scale) // 4
        return max(batch, x)

    pid_dir = tempfile.mkdtemp(dir=tmp, prefix=f"pids-{kind}-")
    biggest = n(600_000)
    full = bt.Workload(kind, biggest, pid_dir)
    fullb = full.batched(batch)
    wls = {"std": full, "batch": fullb, "mp": full.msgpack(), "mpbatch": fullb.msgpack()}

    def wl(mode: str, k: int) -> bt.Workload:
        return wls[mode].take(k)

    reply = {}
    for mode, w in wls.items():
        path = os.path.join(tmp, f"reply-{kind}-{mode}.bin")
        with open(path, "wb") as f:
            f.write(w.reply_stream())
        reply[mode] = path
    cat = 'exec 3<&0; cat <&3 >/dev/null 3<&- & exec cat "$0" 3<&-'
    c = COMPONENTS
    py_cmd = [PY, str(c / f"ours_{kind}.py")]
    api_cmd = [PY, str(c / "ours_echo_batch.py")]
    ruby_cmd = ["ruby", str(c / "ruby_echo.rb")] if kind == "echo" else ["ruby", str(EXAMPLES / "ruby" / "split_bolt.rb")]
    node_cmd = ["node", str(c / "node_echo.js")] if kind == "echo" else ["node", str(EXAMPLES / "node" / "split_bolt.js")]
    mb = f"msgpack+batch {batch}"
    rows = [
        driver_row("cat.std", "driver ceiling (cat), standard", ["sh", "-c", cat, reply["std"]], wl("std", n(600_000))),
        driver_row("cat.batch", f"driver ceiling (cat), batch {batch}", ["sh", "-c", cat, reply["batch"]], wl("batch", n(600_000))),
        driver_row("cat.mp", "driver ceiling (cat), msgpack", ["sh", "-c", cat, reply["mp"]], wl("mp", n(600_000))),
        driver_row("cat.mpbatch", f"driver ceiling (cat), {mb}", ["sh", "-c", cat, reply["mpbatch"]], wl("mpbatch", n(600_000))),
        driver_row("py.std", "python, ours, standard", py_cmd, wl("std", n(150_000))),
        driver_row("py.batch", "python, ours, batched", py_cmd, wl("batch", n(150_000))),
        driver_row("py.mp", "python, ours, msgpack", py_cmd, wl("mp", n(50_000))),
        driver_row("py.mpbatch", "python, ours, msgpack+batched", py_cmd, wl("mpbatch", n(250_000))),
    ]
    if kind == "echo":  # the same bolt on the batch-level API (Bolt.process_batch); batched modes only
        rows += [
            driver_row("pyapi.batch", "python, ours batch API, batched", api_cmd, wl("batch", n(300_000))),
            driver_row("pyapi.mpbatch", "python, ours batch API, msgpack+batched", api_cmd, wl("mpbatch", n(200_000))),
        ]
    return rows + [
        # pystorm exits with status 2 when stdin closes ("Storm went away").
        driver_row("pystorm.std", "python, pystorm, standard", [PY, str(c / f"pystorm_{kind}.py")], wl("std", n(30_000)), (0, 2)),
        host_row("host.std", "host + python ours, standard", py_cmd, wl("std", n(40_000)), []),
        host_row("host.batch", "host + python ours, batched", py_cmd, wl("std", n(40_000)), ["batch"]),
        host_row("host.mpbatch", "host + python ours, msgpack+batched", py_cmd, wl("std", n(40_000)), ["batch", "msgpack"]),
        driver_row("ruby.std", "ruby, standard", ruby_cmd, wl("std", n(40_000))),
        driver_row("ruby.batch", "ruby, batched", ruby_cmd, wl("batch", n(150_000))),
        driver_row("ruby.mp", "ruby, msgpack", ruby_cmd, wl("mp", n(30_000))),
        driver_row("ruby.mpbatch", "ruby, msgpack+batched", ruby_cmd, wl("mpbatch", n(100_000))),
        driver_row("node.std", "node, standard", node_cmd, wl("std", n(100_000))),
        driver_row("node.batch", "node, batched", node_cmd, wl("batch", n(150_000))),
        driver_row("node.mp", "node, msgpack", node_cmd, wl("mp", n(200_000))),
        driver_row("node.mpbatch", "node, msgpack+batched", node_cmd, wl("mpbatch", n(300_000))),
    ]


# --- section 3: Spark ---------------------------------------------------------------


_SPARK_ROW = re.compile(r"^\s+(pipe|bolt\+batch|bolt)\s+([\d.]+)s\s+(\d+) lines/s\s+(\d+) records/s", re.M)
_SPARK_HEAD = re.compile(r"^\[(\w+)\] (\d+) output records", re.M)


def spark_pipe(lines: int, repeat: int, workload: str, timeout: float) -> dict[str, dict[str, float]]:
    """Run bench/spark_pipe.py (interleaved variants, best of ``repeat``) and
    return {workload: {variant: records/s, "lines": ..., "records": ...}}."""
    cmd = [PY, str(HERE / "spark_pipe.py"), "--lines", str(lines), "--repeat", str(repeat), "--workload", workload]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if p.returncode != 0:
        raise bt.BenchError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    out: dict[str, dict[str, float]] = {}
    heads = list(_SPARK_HEAD.finditer(p.stdout))
    for i, h in enumerate(heads):
        block = p.stdout[h.end(): heads[i + 1].start() if i + 1 < len(heads) else len(p.stdout)]
        d: dict[str, float] = {"records": float(h.group(2)), "lines": float(lines)}
        for m in _SPARK_ROW.finditer(block):
            d[m.group(1)] = float(m.group(4))  # records/s
            d[m.group(1) + ".s"] = float(m.group(2))
        out[h.group(1)] = d
    if not out or any(k not in d for d in out.values() for k in ("pipe", "bolt", "bolt+batch")):
        raise bt.BenchError(f"could not read spark_pipe.py's output:\n{p.stdout}")
    return out


# --- section 4: word count -------------------------------------------------------------


_WC_LOCAL = re.compile(r"\[summary\] ([\d.]+)s; trees completed (\d+)")
_WC_SPARK = re.compile(r"\[summary\] spark \(.*?\) ([\d.]+)s; spout tuples \S+: (\d+)")


def wordcount(engine: str, timeout: float) -> dict[str, float]:
    cmd = ["multilang", "run", str(EXAMPLES / "wordcount.toml"), "--no-progress", "-o", os.devnull]
    if engine == "spark":
        cmd[2:2] = ["--engine", "spark"]
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise bt.BenchError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    m = (_WC_SPARK if engine == "spark" else _WC_LOCAL).search(p.stderr)
    words = re.search(r"\[summary\]\s+count: (?:emitted|rows in) (\d+)", p.stderr)
    if not m or not words:
        raise bt.BenchError(f"could not read the summary of {' '.join(cmd)}:\n{p.stderr[-3000:]}")
    secs, sentences = float(m.group(1)), int(m.group(2))
    return {"secs": secs, "wall": wall, "sentences": sentences, "words": int(words.group(1)),
            "rate": sentences / secs, "word_rate": int(words.group(1)) / secs}


# --- the report ---------------------------------------------------------------------------


def fmt_rate(x: float) -> str:
    return f"{x:,.0f}/s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller runs, R=2, small Spark data, no Spark word count (< 2 min)")
    ap.add_argument("--repeat", type=int, default=None, help="timed runs per variant, best counts (default 3; --quick 2)")
    ap.add_argument("--batch", type=int, default=100, help="tuples per host frame in batched driver runs (default 100)")
    ap.add_argument("--no-spark", action="store_true", help="skip the Spark sections")
    ap.add_argument("--spark-lines", type=int, default=None,
                    help="lines for bench/spark_pipe.py's split workload (default 20000; --quick 2000)")
    ap.add_argument("--spark-line-lines", type=int, default=100_000,
                    help="lines for its one-record-per-line workload (default 100000; not run with --quick)")
    ap.add_argument("--json", metavar="FILE", help="also write every measurement to FILE as JSON")
    args = ap.parse_args()
    repeat = args.repeat or (2 if args.quick else 3)
    scale = 0.2 if args.quick else 1.0
    spark_lines = args.spark_lines or (2000 if args.quick else 20000)
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("multilang").setLevel(logging.ERROR)

    started = time.perf_counter()
    load0 = os.getloadavg()[0]
    print(f"run_all: python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load avg {load0:.2f}; "
          f"best of {repeat}, interleaved{' (quick)' if args.quick else ''}", file=sys.stderr, flush=True)
    tmp = tempfile.mkdtemp(prefix="bench-run-all-")
    rows: dict[str, dict[str, Row]] = {}
    spark: dict[str, dict[str, float]] = {}
    wc: dict[str, dict[str, float]] = {}
    errors: list[str] = []
    try:
        for kind in ("echo", "split"):
            rs = bolt_rows(kind, scale, args.batch, tmp)
            measure(rs, repeat, kind, errors)
            rows[kind] = {r.key: r for r in rs}
        wc_runs = [wordcount("local", 120) for _ in range(repeat)]
        wc["local"] = min(wc_runs, key=lambda d: d["secs"])
        print(f"  [wordcount local] {len(wc_runs)} runs", file=sys.stderr, flush=True)
        if not args.no_spark:
            try:
                spark = spark_pipe(spark_lines, 1 if args.quick else repeat, "split", timeout=480)
                print("  [spark pipe, split] done", file=sys.stderr, flush=True)
                if not args.quick:
                    spark.update(spark_pipe(args.spark_line_lines, repeat, "line", timeout=480))
                    print("  [spark pipe, line] done", file=sys.stderr, flush=True)
            except (bt.BenchError, subprocess.TimeoutExpired) as exc:
                errors.append(f"spark_pipe: {exc}")
            if not args.quick:
                try:
                    wc["spark"] = wordcount("spark", 300)
                    print("  [wordcount spark] done", file=sys.stderr, flush=True)
                except (bt.BenchError, subprocess.TimeoutExpired) as exc:
                    errors.append(f"wordcount spark: {exc}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.perf_counter() - started
    load1 = os.getloadavg()[0]

    # -- rates -----------------------------------------------------------------------
    print(f"\n== multilang-bridge benchmarks: python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"load avg {load0:.2f} -> {load1:.2f}, best of {repeat} interleaved, {elapsed:.0f}s ==")
    def cells(r: Row | None) -> str:
        if r is None:
            return f"{'-':>8} {'-':>11}"
        return f"{r.n:>8,} {'FAILED' if r.error else f'{r.best:,.0f}':>11}"

    print("\nrates (tuples/s, best run; N = input tuples per run)")
    print(f"  {'variant':<40} {'echo N':>8} {'echo':>11} {'split N':>8} {'split':>11}")
    for key in rows["echo"]:
        e, s = rows["echo"][key], rows["split"].get(key)
        print(f"  {e.label:<40} {cells(e)} {cells(s)}")

    # -- ratios ------------------------------------------------------------------------
    table: list[tuple[str, float, float, str]] = []  # (what, measured, baseline, target text)
    targets: list[tuple[str, float, float, float | None]] = []  # (text, value, goal, stretch)

    for kind in ("echo", "split"):
        echo = kind == "echo"
        for what, a, b, goal in (
            ("python: host+lib / driver+lib, standard", "host.std", "py.std", 0.8 if echo else None),
            ("python: host+lib / driver+lib, batched", "host.batch", "py.batch", None),
            ("python: host+lib / driver+lib, msgpack+batched", "host.mpbatch", "py.mpbatch", None),
            ("python: host batched / host standard", "host.batch", "host.std", None),
            ("python: host msgpack+batched / host standard", "host.mpbatch", "host.std", None),
            ("python: ours / pystorm (driver, standard)", "py.std", "pystorm.std", None),
            ("python: batched / standard (driver)", "py.batch", "py.std", 4.0 if echo else None),
            ("python: msgpack / standard (driver)", "py.mp", "py.std", None),
            ("python: msgpack+batch / standard (driver)", "py.mpbatch", "py.std", None),
            ("python: batch API (process_batch) / standard (driver)", "pyapi.batch", "py.std", 4.0 if echo else None),
            ("python: batch API, msgpack+batch / standard (driver)", "pyapi.mpbatch", "py.std", None),
            ("ruby:   batched / standard (driver)", "ruby.batch", "ruby.std", 2.0 if echo else None),
            ("ruby:   msgpack / standard (driver)", "ruby.mp", "ruby.std", None),
            ("ruby:   msgpack+batch / standard (driver)", "ruby.mpbatch", "ruby.std", None),
            ("node:   batched / standard (driver)", "node.batch", "node.std", 2.0 if echo else None),
            ("node:   msgpack / standard (driver)", "node.mp", "node.std", None),
            ("node:   msgpack+batch / standard (driver)", "node.mpbatch", "node.std", None),
        ):
            if a not in rows[kind] or b not in rows[kind]:
                continue  # e.g. the batch-API component has no split variant
            x, y = rows[kind][a].best, rows[kind][b].best
            table.append((f"{kind:<5} {what}", x, y, f">= {goal:g}x" if goal else ""))
            if goal:
                targets.append((f"{kind} {what}", x / y, goal, None))
    for wl, d in spark.items():
        for variant, goal in (("bolt", None), ("bolt+batch", 1.0)):
            name = "standard" if variant == "bolt" else "batched"
            what = f"spark {wl}: shell bolt (acked, mapInArrow, {name}) / RDD.pipe"
            table.append((f"{what}", d[variant], d["pipe"], ">= 1x (2x)" if goal else ""))
            if goal:
                targets.append((f"{what}", d[variant] / d["pipe"], goal, 2.0))
    if "local" in wc and "spark" in wc:
        table.append(("wordcount: spark engine / embedded engine (sentences/s)", wc["spark"]["rate"], wc["local"]["rate"], ""))

    print("\nratios (both numbers from this run; tuples/s unless noted)")
    print(f"  {'what':<66} {'measured':>12} {'baseline':>12} {'ratio':>7}  target")
    def num(v: float) -> str:
        return "FAILED" if v != v else f"{v:,.0f}"  # nan: a failed row

    for what, x, y, goal in table:
        r = x / y
        print(f"  {what:<66} {num(x):>12} {num(y):>12} {'n/a' if r != r else f'{r:.2f}':>6}x  {goal}")
    if spark:
        for wl, d in spark.items():
            print(f"  (spark {wl}: {int(d['lines']):,} lines -> {int(d['records']):,} records; records/s; "
                  f"best runs pipe {d['pipe.s']:.2f}s, bolt {d['bolt.s']:.2f}s, bolt+batch {d['bolt+batch.s']:.2f}s)")
    for eng, d in wc.items():
        print(f"  wordcount on {eng:<5}: {d['sentences']:,} sentences, {d['words']:,} words in {d['secs']:.1f}s "
              f"(wall {d['wall']:.1f}s) = {d['rate']:,.0f} sentences/s, {d['word_rate']:,.0f} words/s")

    # -- the driver ceiling -----------------------------------------------------------------
    print("\ndriver ceiling (cat replaying a correct reply stream; must be >= 1.5x the fastest bolt of its mode)")
    ceiling_ok = True
    mode_names = {"std": "standard", "batch": "batched", "mp": "msgpack", "mpbatch": "msgpack+batch"}
    for kind in ("echo", "split"):
        rk = rows[kind]
        for mode, mode_name in mode_names.items():
            bolts = [r for k, r in rk.items()
                     if k.endswith("." + mode) and not k.startswith(("cat.", "host.")) and not r.error]
            cat = rk[f"cat.{mode}"]
            if cat.error or not bolts:
                ceiling_ok = False
                print(f"  {kind:<5} {mode_name:<13}: NOT MEASURED ({'the cat row failed' if cat.error else 'every bolt failed'})")
                continue
            top = max(bolts, key=lambda r: r.best)
            head = cat.best / top.best
            ok = head >= 1.5
            ceiling_ok &= ok
            print(f"  {kind:<5} {mode_name:<13}: {cat.best:>12,.0f} tuples/s "
                  f"= {head:5.1f}x the fastest bolt ({top.label}, {top.best:,.0f}){'' if ok else '  <-- WARNING: driver may be limiting'}")

    # -- targets --------------------------------------------------------------------------
    print("\ntargets")
    for text, value, goal, stretch in targets:
        if value != value:  # a failed row
            print(f"  {text:<74} {'n/a':>6}   (>= {goal:g}x)  NOT MEASURED (see errors)")
            continue
        line = f"  {text:<74} {value:6.2f}x  (>= {goal:g}x)  {'MET' if value >= goal else 'NOT MET'}"
        if stretch:
            line += f"; stretch {stretch:g}x {'MET' if value >= stretch else 'NOT MET'}"
        print(line)
    if not spark and not args.no_spark:
        print("  spark targets: NOT MEASURED (see errors)")
    print(f"  driver not the bottleneck (ceiling >= 1.5x the fastest bolt, every mode)                {'MET' if ceiling_ok else 'NOT MET'}")
    for e in errors:
        print(f"\nERROR {e[:3000]}")

    if args.json:
        doc = {
            "python": sys.version.split()[0], "cpus": os.cpu_count(), "load": [load0, load1], "repeat": repeat,
            "quick": args.quick, "batch": args.batch, "seconds": elapsed,
            "bolts": {k: {key: {"label": r.label, "n": r.n, "rates": r.rates,
                                "best": None if r.error else r.best, "error": r.error}
                          for key, r in rs.items()}
                      for k, rs in rows.items()},
            "spark": spark, "wordcount": wc, "errors": errors,
        }
        Path(args.json).write_text(json.dumps(doc, indent=1))
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
