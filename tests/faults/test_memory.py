"""Bounded host memory (issue 18): at a steady rate under a long message
timeout, the host's memory must not grow with run length. Before, each bolt
kept a record of every tuple it sent until the message timeout passed,
acked or not (127 MiB at ~10k tuples/s with a 30 s timeout, still rising
past 207 MiB with 120 s)."""

from __future__ import annotations

import statistics
import subprocess
import time

from faults_support import COMPONENTS, ML, ROOT, toml_str

#: trees in the run: a per-tuple record kept for the timeout (about 100 bytes a
#: tuple when issue 18 was found) would add 10 MiB between the two windows
N_TUPLES = 150_000
EARLY = (30_000, 50_000)  # emitted-count windows whose RSS samples are compared
LATE = (130_000, 150_000)


def _rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _emitted(state) -> int | None:
    try:
        return int(state.read_text())
    except (OSError, ValueError):
        return None


def test_host_rss_stays_flat_at_a_steady_rate_under_a_120s_timeout(tmp_path):
    # The samples are placed by how many tuples the spout had emitted (its
    # durable offset, written after each burst), not by the clock: on a
    # busy machine the run is slower and the windows get more samples.
    state = tmp_path / "offset"
    spout = ["python", str(COMPONENTS / "numbered_spout.py"), str(N_TUPLES), "--per-next", "100", "--no-events",
             "--state", str(state)]
    bolt = ["python", str(COMPONENTS / "faulty_bolt.py")]
    topo = tmp_path / "fast.toml"
    topo.write_text(
        '[topology.conf]\n"topology.message.timeout.secs" = 120\n"topology.max.spout.pending" = 2000\n'
        f'[spouts.spout]\ncommand = {toml_str(spout)}\nfields = ["n"]\n'
        f'[bolts.bolt]\ncommand = {toml_str(bolt)}\nfields = ["n"]\ninputs = [{{ source = "spout" }}]\n'
    )
    proc = subprocess.Popen(ML + ["run", str(topo), "--no-progress", "-o", "/dev/null"],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True)
    samples: list[tuple[int, float]] = []
    try:
        while proc.poll() is None:
            emitted, rss = _emitted(state), _rss_mib(proc.pid)
            if emitted is not None and rss:
                samples.append((emitted, rss))
            time.sleep(0.02)
        err = proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err[-2000:]
    completed = int(err.split("trees completed ")[1].split(",")[0])
    assert completed == N_TUPLES, err[-1000:]
    early = [r for n, r in samples if EARLY[0] <= n < EARLY[1]]
    late = [r for n, r in samples if LATE[0] <= n < LATE[1]]
    assert len(early) >= 3 and len(late) >= 3, f"too few samples: {samples[::20]}"
    assert statistics.median(late) - statistics.median(early) < 6, (
        f"RSS grew from {statistics.median(early):.1f} to {statistics.median(late):.1f} MiB between "
        f"{EARLY[0]:,} and {LATE[1]:,} tuples: memory depends on run length")
