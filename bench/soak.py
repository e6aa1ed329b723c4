#!/usr/bin/env python
"""Soak: a three-language topology under random SIGKILLs; nothing may be lost.

    python bench/soak.py [--tuples N] [--kill-every MIN,MAX] [--seed S]
                         [--max-spout-pending P] [--no-hold] [--limit SECONDS] [--json]

Topology (embedded runtime, ``multilang.shellbolt.Runtime``):

    spout  Python, this file run as a component: a durable numbered source
           (see below), emits ["w<i>"] with message id i, i = 0..N-1
    ruby   examples/ruby/split_bolt.rb, 2 tasks   (["w<i>"] -> ["w<i>"])
    node   examples/node/split_bolt.js, 2 tasks   (["w<i>"] -> ["w<i>"], the sink)

Every MIN..MAX seconds (uniformly random, default 1..5) a random component
process (spout, ruby or node task) gets SIGKILL. The restart budget is raised
so the supervisor never gives up during the soak.

Printed at the end: tuples in (distinct ids the source holds), spout emits
(replays included), tuples out (at the sink), distinct out, lost (ids never
seen at the sink: must be 0), duplicates at the sink, kills and restarts per
component, acker figures, duration, rate and the host's peak RSS (VmHWM).

Duplicates. Both bolts run with ``multilang.hold.emits.until.ack`` (the
sink's emits are the output, so it needs hold mode as much as the middle
stage), and every tuple tree is a chain (one word per line): a killed bolt
process leaves no output behind for the trees it had in flight, so bolt kills
cause no duplicates. A killed *spout* does: the source commits its offset
after writing each burst of emits, so a spout killed between the write and
the commit emits that burst (<= --per-next ids) again after the restart
(at-least-once, as with any source that commits after sending). The trees
the dead spout started keep running and their acks and fails reach the new
process, which replays any failed id, known to it or not (spec §8.2).
Without --no-hold, duplicates must be <= spout kills x per-next.

--limit SECONDS bounds the run (default 3600): when it passes, the kills stop,
the runtime stops gracefully (spouts deactivated, in-flight trees drained;
cancelled after 2 s more, its processes killed and reaped) and the report is
printed with ``limit_reached`` true. Tuples that have not come out by then are
``not_out``, not lost: the run was cut short, so ``lost`` is unknown (null)
and the soak is inconclusive.

Exit status: 0 if lost == 0 (and the duplicate bound holds); 1 if something
was lost, duplicated beyond the bound, malformed, or a component gave up (also
when --limit cut the run short: those are failures already); 3 if --limit
stopped the run before every tuple came out and nothing had failed by then;
2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STOP_WAIT = 2.0  # seconds the runtime gets to stop gracefully once --limit has passed
EXAMPLES = ROOT / "examples"


# --- the spout component (stdlib only; run as `soak.py --component spout ...`) ---------------


def spout_component(n: int, state: str, per_next: int) -> None:
    """A durable numbered source speaking raw multilang on stdin/stdout."""
    term = re.compile(rb"(?:\A|(?<=[\r\n]))end(?:\r\n|\n|\r)")
    sync = b'{"command":"sync"}\nend\n'

    def write(data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(1, view):]

    def emit(i: int) -> str:
        return f'{{"command":"emit","id":{i},"tuple":["w{i}"],"need_task_ids":false}}\nend\n'

    offset = 0
    if os.path.exists(state):
        with open(state) as f:
            offset = int(f.read().strip() or 0)
    replay: list[int] = []
    buf = bytearray()
    handshaken = False
    while True:
        data = os.read(0, 1 << 16)
        if not data:
            return
        buf += data
        start = 0
        out: list[str] = []
        committed = True
        for m in term.finditer(buf):
            body = bytes(buf[start:m.start()])
            start = m.end()
            if not body.strip():
                continue
            msg = json.loads(body)
            if not handshaken:
                handshaken = True
                pid = os.getpid()
                open(os.path.join(msg["pidDir"], str(pid)), "w").close()
                out.append(f'{{"pid":{pid}}}\nend\n')
                continue
            if isinstance(msg, list):
                continue
            cmd = msg.get("command")
            if cmd == "next":
                k = 0
                while replay and k < per_next:
                    out.append(emit(replay.pop()))
                    k += 1
                while offset < n and k < per_next:
                    out.append(emit(offset))
                    offset += 1
                    k += 1
                    committed = False
            elif cmd == "fail":
                replay.append(msg["id"])  # known to this process or not: a durable id
            out.append(sync.decode())
        if start:
            del buf[:start]
        if out:
            write("".join(out).encode())
        if not committed:
            tmp = state + ".tmp"
            with open(tmp, "w") as f:
                f.write(str(offset))
            os.replace(tmp, state)


# --- the soak ------------------------------------------------------------------------------------


def peak_rss_mib() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def soak(n: int, kill_every: tuple[float, float], seed: int, msp: int, per_next: int, hold: bool,
         progress: bool, limit: float) -> dict:
    import trio

    from multilang.shellbolt import Runtime, ShellBolt, ShellSpout, TopologyBuilder

    rng = random.Random(seed)
    tmp = tempfile.mkdtemp(prefix="multilang-soak-")
    state = os.path.join(tmp, "offset")
    hold_conf = {"multilang.hold.emits.until.ack": hold}
    b = TopologyBuilder()
    b.set_spout("spout", ShellSpout([sys.executable, str(Path(__file__).resolve()), "--component", "spout",
                                     str(n), state, str(per_next)], fields=["word"]))
    b.set_bolt("ruby", ShellBolt(["ruby", "ruby/split_bolt.rb"], fields=["word"]), parallelism=2,
               conf=hold_conf).shuffle_grouping("spout")
    b.set_bolt("node", ShellBolt(["node", "node/split_bolt.js"], fields=["word"]), parallelism=2,
               conf=hold_conf).shuffle_grouping("ruby")
    topo = b.create_topology({
        "topology.max.spout.pending": msp,
        "multilang.restart.budget": 1_000_000,  # never give up during a soak
        "multilang.shutdown.grace.secs": 5,
        "multilang.kill.grace.secs": 1,
    }, resource_dir=EXAMPLES)

    seen = bytearray(n)  # times each id reached the sink (saturating): 1 byte per tuple
    bad_outputs = 0
    out_total = 0

    def on_output(rec: dict) -> None:
        nonlocal out_total, bad_outputs
        out_total += 1
        word = rec.get("word")
        try:
            i = int(word[1:])
            if seen[i] < 255:
                seen[i] += 1
        except (TypeError, ValueError, IndexError):
            bad_outputs += 1

    kills: dict[str, int] = {"spout": 0, "ruby": 0, "node": 0}
    rt = Runtime(topo, on_output=on_output)

    async def killer() -> None:
        tasks = [t for c in ("spout", "ruby", "node") for t in topo.components[c].tasks]
        while True:
            await trio.sleep(rng.uniform(*kill_every))
            tid = rng.choice(tasks)
            task = rt.tasks[tid]
            proc = getattr(task, "proc", None)
            if proc is None or proc.proc is None or proc.pid is None or proc.proc.returncode is not None:
                continue  # between processes (restarting): skip this round
            try:
                os.kill(proc.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            kills[task.name] += 1

    async def reporter() -> None:
        t0 = time.monotonic()
        while True:
            await trio.sleep(5)
            done = sum(1 for x in seen if x)  # O(n) but only every 5 s
            print(f"[soak] {time.monotonic() - t0:6.1f}s  distinct out {done}/{n}  kills {kills}  "
                  f"pending {rt.acker.pending}", file=sys.stderr, flush=True)

    limit_reached = False

    async def main():
        nonlocal limit_reached
        kills_scope = trio.CancelScope()
        run_scope = trio.CancelScope()

        async def kill_until_stopped() -> None:
            with kills_scope:
                await killer()

        async def stop_at_limit() -> None:
            # --limit is a time limit on the whole soak, not an error: stop the
            # kills and ask the runtime for its graceful stop (drain within the
            # shutdown grace), which returns a RunResult like any other end.
            nonlocal limit_reached
            await trio.sleep(limit)
            limit_reached = True
            kills_scope.cancel()
            print(f"[soak] --limit {limit:g}s reached: stopping the kills and the runtime", file=sys.stderr,
                  flush=True)
            rt.request_stop()
            # The drain may take the whole shutdown grace; the report matters
            # more. Past STOP_WAIT, cancel: the runtime still kills and reaps
            # every process, and its figures so far are the report.
            await trio.sleep(STOP_WAIT)
            print(f"[soak] the runtime did not stop within {STOP_WAIT:g}s of the limit: cancelling it",
                  file=sys.stderr, flush=True)
            run_scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(kill_until_stopped)
            nursery.start_soon(stop_at_limit)
            if progress:
                nursery.start_soon(reporter)
            result = None
            with run_scope:
                result = await rt.run(until_done=True)
            nursery.cancel_scope.cancel()
        return result if result is not None else rt.result()

    start = time.monotonic()
    result = trio.run(main)
    elapsed = time.monotonic() - start
    distinct = sum(1 for x in seen if x)
    duplicates = sum(x - 1 for x in seen if x > 1)
    # Cut short by --limit, an id not seen at the sink may simply not have been
    # emitted yet (or be in a tree abandoned at the stop): not_out, not lost.
    incomplete = limit_reached and distinct < n
    report = {
        "tuples_in": n,
        "spout_emits": result.stats["spout"].emitted,
        "tuples_out": out_total,
        "distinct_out": distinct,
        "lost": None if incomplete else n - distinct,
        "not_out": n - distinct,
        "limit_reached": limit_reached,
        "duplicates": duplicates,
        "bad_outputs": bad_outputs,
        "kills": kills,
        "restarts": {name: s.restarts for name, s in result.stats.items()},
        "trees_completed": result.completed,
        "trees_failed": result.failed,
        "trees_timed_out": result.timed_out,
        "trees_incomplete": result.pending,
        "gave_up": [str(e) for e in result.gave_up],
        "seconds": round(elapsed, 2),
        "tuples_per_sec": round((distinct if incomplete else n) / elapsed) if elapsed else None,
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "hold": hold,
        "per_next": per_next,
        "max_spout_pending": msp,
        "seed": seed,
    }
    try:
        os.unlink(state)
        os.rmdir(tmp)
    except OSError:
        pass
    return report


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--component":
        _, _, role, n, state, per_next = sys.argv
        assert role == "spout"
        spout_component(int(n), state, int(per_next))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tuples", type=int, default=1_000_000)
    p.add_argument("--kill-every", default="1,5", help="MIN,MAX seconds between kills (uniform)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--max-spout-pending", type=int, default=2000)
    p.add_argument("--per-next", type=int, default=50)
    p.add_argument("--no-hold", action="store_true", help="at-least-once: bolt kills then duplicate too")
    p.add_argument("--limit", type=float, default=3600,
                   help="stop the soak after this many seconds (graceful stop, report, exit 3 if not all out)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON line on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = p.parse_args()
    lo, _, hi = args.kill_every.partition(",")
    kill_every = (float(lo), float(hi or lo))
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    report = soak(args.tuples, kill_every, seed, args.max_spout_pending, args.per_next, not args.no_hold,
                  not args.quiet, args.limit)
    dup_bound = report["kills"]["spout"] * args.per_next
    failed = bool(report["lost"] or report["bad_outputs"] or report["gave_up"]) or (
        not args.no_hold and report["duplicates"] > dup_bound)
    inconclusive = not failed and report["lost"] is None
    ok = not failed and not inconclusive
    report["ok"] = ok
    if args.json:
        print(json.dumps(report))
    else:
        w = max(len(k) for k in report)
        for k, v in report.items():
            print(f"{k:<{w}}  {v}")
        if not args.no_hold:
            print(f"{'duplicate bound':<{w}}  {dup_bound} (spout kills x per-next)")
    if inconclusive:
        print(f"soak: inconclusive: --limit {args.limit:g}s stopped the run after {report['seconds']}s with "
              f"{report['distinct_out']} of {report['tuples_in']} tuples out and nothing failed so far; "
              f"raise --limit or lower --tuples (exit 3)", file=sys.stderr)
    elif failed:
        print("soak: FAILED: " + ", ".join(
            what for what, bad in [
                (f"lost {report['lost']}", report["lost"]),
                (f"bad outputs {report['bad_outputs']}", report["bad_outputs"]),
                (f"gave up: {report['gave_up']}", report["gave_up"]),
                (f"duplicates {report['duplicates']} > bound {dup_bound}",
                 not args.no_hold and report["duplicates"] > dup_bound),
            ] if bad), file=sys.stderr)
    sys.exit(0 if ok else 3 if inconclusive else 1)


if __name__ == "__main__":
    main()
