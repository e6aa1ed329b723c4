"""observe.py's arithmetic (histograms, windows, capacity, probes) and the
live view's rendering of a snapshot (multilang/_cli/live.py). No processes."""

from __future__ import annotations

import io
import re

import pytest

from multilang._cli.live import LiveView, fmt_count, fmt_duration, fmt_ms
from multilang.shellbolt._observe.observe import MAX_PROBES, WINDOW, Histogram, TaskObs


def test_histogram_percentiles_are_within_the_bucket_resolution():
    h = Histogram()
    for i in range(1, 1001):  # 1 ms .. 1 s, uniform
        h.add(i / 1000)
    for q, true in ((0.5, 0.5), (0.99, 0.99), (0.01, 0.01)):
        assert h.percentile(q) == pytest.approx(true, rel=0.1)
    assert h.count == 1000


def test_histogram_weights_merge_and_empty():
    assert Histogram().percentile(0.5) is None
    assert Histogram().summary() == {"p50": None, "p99": None, "count": 0}
    a, b = Histogram(), Histogram()
    a.add(0.001, 99)  # one sample standing for a batch of 99
    b.add(2.0)
    m = Histogram().merge(a).merge(b)
    assert m.count == 100
    assert m.percentile(0.5) == pytest.approx(0.001, rel=0.1)
    assert m.percentile(1.0) == pytest.approx(2.0, rel=0.1)
    s = m.summary()
    assert s["p50"] == pytest.approx(1.0, rel=0.1) and s["count"] == 100  # milliseconds
    h = Histogram()
    h.add(0.0)
    h.add(1e9)  # out of range: clamped into the first and last buckets, not an error
    assert h.count == 2


def test_capacity_is_the_busy_share_of_the_window():
    o = TaskObs()
    o.begin(0.0)
    o.wrote(0.0, "t1", 10)
    o.settled(1.0, {})  # busy from 0 to 1, idle from 1 to 2
    assert o.capacity(2.0) == pytest.approx(0.5)
    lat = o.latency(2.0)
    assert lat.count == 10 and lat.percentile(0.5) == pytest.approx(1.0, rel=0.1)
    # still busy (a tuple unsettled): the open interval counts
    o.wrote(2.0, "t2", 1)
    o.settled(3.0, {"t2": object()})
    assert o.capacity(4.0) == pytest.approx(3 / 4)


def test_pipelined_tuples_do_not_push_capacity_over_one():
    # Storm's executed x latency / window would be 100 x 1 s / 1 s = 100 here.
    o = TaskObs()
    o.begin(0.0)
    o.wrote(0.0, "t", 100)
    o.settled(1.0, {})
    assert o.capacity(1.0) == 1.0


def test_windows_forget_old_latencies_and_busy_time():
    o = TaskObs()
    o.begin(0.0)
    o.wrote(0.0, "t", 1)
    o.settled(0.5, {})
    assert o.latency(1.0).count == 1
    assert o.latency(WINDOW + 1).count == 1  # the previous window is still shown
    assert o.latency(3 * WINDOW).count == 0  # two windows later: gone
    assert o.capacity(5 * WINDOW) == 0.0


def test_probes_are_bounded_and_the_oldest_is_dropped_after_a_window():
    o = TaskObs()
    o.begin(0.0)
    for i in range(MAX_PROBES + 5):
        o.wrote(0.1 * i, f"t{i}", 1)
    assert len(o.probes) == MAX_PROBES
    o.wrote(WINDOW + 1, "late", 1)  # the bolt never acked the first: it makes room
    assert len(o.probes) == MAX_PROBES and "late" in o.probes and "t0" not in o.probes
    o.lost(WINDOW + 2)  # the process died: its probes are gone with it
    assert not o.probes and o.busy_since is None


def test_an_in_process_bolt_records_its_bursts():
    o = TaskObs()
    o.begin(0.0)
    o.ran(0.0, 0.5, 100)
    assert o.latency(1.0).percentile(0.5) == pytest.approx(0.005, rel=0.1)
    assert o.capacity(1.0) == pytest.approx(0.5)


def test_formats():
    assert [fmt_count(n) for n in (0, 9999, 12345, 2_500_000)] == ["0", "9999", "12.3k", "2.5M"]
    assert [fmt_ms(v) for v in (None, 0.123, 4.56, 123.4, 45_000)] == ["-", "0.12", "4.6", "123", "45s"]
    assert [fmt_duration(s) for s in (3.21, 125, 3725)] == ["3.2s", "2m05s", "1h02m"]


def _snap(stalled: bool = False, error: str | None = None) -> dict:
    lat = {"p50": 1.5, "p99": 20.0, "count": 10}
    none = {"p50": None, "p99": None, "count": 0}

    def row(kind: str, **kw):
        return {"kind": kind, "emitted": 100, "executed": 0, "acked": 90, "failed": 1, "restarts": 2, "errors": 0,
                "in_flight": 9, "queued": 0, "execute_latency_ms": none if kind == "spout" else lat,
                "complete_latency_ms": lat if kind == "spout" else None,
                "capacity": None if kind == "spout" else 0.25, "last_error": error, "extensions": [], "metrics": {},
                **kw}

    return {"topology": "t", "elapsed_s": 12.5, "stalled": stalled, "stall_secs": 5.0, "eta_s": 30.0,
            "remaining": 10,
            "trees": {"in_flight": 9, "completed": 90, "failed": 1, "timed_out": 0, "complete_latency_ms": lat,
                      "stalled_s": 7.0 if stalled else 0.0},
            "components": {"spout": row("spout", tasks=[1]), "a-bolt-with-a-long-name": row("bolt", tasks=[2])},
            "tasks": {"spout:1": row("spout", component="spout", task=1, pid=1),
                      "a-bolt-with-a-long-name:2": row("bolt", component="a-bolt-with-a-long-name", task=2, pid=2)}}


def test_a_frame_is_clipped_to_the_terminal_and_a_stall_is_loud():
    view = LiveView(io.StringIO(), tty=True, width=80, height=20)
    lines = view.frame(_snap(stalled=True, error="Traceback ...\n  boom: a very long error message " * 5))
    plain = [re.sub(r"\x1b\[[0-9;]*m", "", ln) for ln in lines]
    assert plain[0].startswith("STALLED: 9 trees in flight, none completed for 7.0s")
    assert "\x1b[1;37;41m" in lines[0]  # loud: bold on red
    assert plain[1].startswith("t  12.5s  trees: 9 in flight, 90 completed, 1 failed")
    assert all(len(ln) <= 79 for ln in plain)
    assert any(ln.startswith("spout ") and "1.5/20" in ln for ln in plain)


def test_frames_are_redrawn_in_place():
    term = io.StringIO()
    view = LiveView(term, tty=True, width=100, height=20)
    view.show(_snap())
    first = term.getvalue()
    view.show(_snap())
    again = term.getvalue()[len(first):]
    n = len(view.frame(_snap()))
    assert again.startswith(f"\x1b[{n}F")  # back to the first line of the last frame
    view.clear()
    assert term.getvalue().endswith(f"\x1b[{n}F\x1b[J")


def test_plain_lines_are_short_and_say_elapsed_in_flight_and_stall():
    view = LiveView(io.StringIO(), tty=False, tasks=True)
    lines = view.lines(_snap(stalled=True, error="x" * 300))
    assert all(ln.startswith("[progress] 12.5s ") and len(ln) <= 120 for ln in lines)
    assert "STALLED" in lines[1]
    assert "in flight 9" in lines[2] and "complete 1.5/20ms" in lines[2]
    assert any(ln.startswith("[progress] 12.5s a-bolt-with-a-long-name:2: emitted 100") for ln in lines)
