#!/usr/bin/env python
"""CPU instructions per tuple, counted by valgrind: a deterministic companion
to bolt_throughput.py's tuples per second.

    python bench/instructions.py [--tuples N] [--kind echo|split]

On a shared or virtual machine, wall-clock rates of short runs can swing by
half from one run to the next; instruction counts do not. Each component
(bench/components/: ours, hand-written, pystorm) reads the same pre-encoded
handshake and N tuple frames from a file (no driver, no pipe) and writes to a
file, under ``valgrind --tool=callgrind``. A second run with the handshake
alone gives the start-up cost, which is subtracted:

    instructions per tuple = (Ir(handshake + N tuples) - Ir(handshake)) / N

The output of every counted run is checked: one ack per tuple and the
expected number of emits. ``PYTHONHASHSEED=0`` fixes string hashing, so
repeated runs agree to within a few instructions per tuple. Ratios are inverse instruction ratios (a bolt that
needs half the instructions counts as 2x), comparable with the throughput
ratios but not the same thing: time also depends on memory, system calls and
the other processes on the machine. Needs valgrind (Debian: ``valgrind``).
pystorm, ~50x slower under valgrind, runs N/10 tuples.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bolt_throughput import COMPONENTS, TERM, Workload, _count  # noqa: E402


def instructions(cmd: list[str], stdin_path: str, out_path: str) -> int:
    """Instructions (callgrind's Ir) executed by ``cmd`` reading ``stdin_path``."""
    with open(stdin_path, "rb") as fin, open(out_path, "wb") as fout:
        r = subprocess.run(
            ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *cmd],
            stdin=fin, stdout=fout, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONHASHSEED": "0"},  # same set and dict probing every run
        )
    if r.returncode not in (0, 2):  # pystorm exits 2 when stdin closes
        raise SystemExit(f"{cmd} exited {r.returncode}:\n{r.stderr[-2000:]}")
    m = re.search(r"Collected : (\d+)", r.stderr)
    if not m:
        raise SystemExit(f"no instruction count from valgrind for {cmd}:\n{r.stderr[-2000:]}")
    return int(m.group(1))


def per_tuple(name: str, cmd: list[str], wl: Workload, tmp: str) -> float:
    full = os.path.join(tmp, f"in-{wl.n}.bin")
    hs = os.path.join(tmp, "handshake.bin")
    for path, data in ((full, wl.handshake + wl.blob), (hs, wl.handshake)):
        if not os.path.exists(path):
            with open(path, "wb") as f:
                f.write(data)
    out = os.path.join(tmp, "out.bin")
    ir_full = instructions(cmd, full, out)
    with open(out, "rb") as f:
        body = f.read()
    _frames, acks, emits = _count(body[body.index(TERM) + len(TERM):])  # after the pid reply
    if acks != wl.n or emits != wl.n_emits:
        raise SystemExit(f"{name}: {acks} acks and {emits} emits for {wl.n} tuples ({wl.n_emits} emits expected)")
    ir_hs = instructions(cmd, hs, out)
    return (ir_full - ir_hs) / wl.n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tuples", type=int, default=50_000, help="tuples per counted run (default 50000)")
    ap.add_argument("--kind", choices=["echo", "split"], default="echo", help="workload (default echo)")
    args = ap.parse_args()
    if not shutil.which("valgrind"):
        raise SystemExit("valgrind not found (Debian: apt-get install valgrind)")
    py = sys.executable
    c = str(COMPONENTS)
    tmp = tempfile.mkdtemp(prefix="bench-instr-")
    try:
        os.chmod(tmp, 0o700)
        pid_dir = os.path.join(tmp, "pids")
        os.mkdir(pid_dir, 0o700)
        wl = Workload(args.kind, args.tuples, pid_dir)
        small = wl.take(max(1, args.tuples // 10))
        plan = [
            ("hand-written", [py, f"{c}/handwritten.py", args.kind], wl),
            ("ours", [py, f"{c}/ours_{args.kind}.py"], wl),
            ("pystorm", [py, f"{c}/pystorm_{args.kind}.py"], small),
        ]
        got = {}
        for name, cmd, w in plan:
            got[name] = per_tuple(name, cmd, w, _dir(tmp, name))
            print(f"  {name:<13} N={w.n:>7,}  {got[name]:>9,.0f} instructions/tuple", flush=True)
        print(f"\n{args.kind}: ours/pystorm {got['pystorm'] / got['ours']:.2f}x, "
              f"ours/hand-written {got['hand-written'] / got['ours']:.2f}x (inverse instruction ratios)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _dir(tmp: str, name: str) -> str:
    d = os.path.join(tmp, name.replace(" ", "-"))
    os.makedirs(d, exist_ok=True)
    return d


if __name__ == "__main__":
    main()
