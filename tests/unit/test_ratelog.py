"""RateLimitedLog: the same error for many tuples is logged once per interval
per kind, then as a count (issue 18: never once per tuple)."""

from __future__ import annotations

import logging

from multilang.shellbolt._observe.ratelog import RateLimitedLog, kind_of

LOG = logging.getLogger("multilang.test.ratelog")


def _messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOG.name]


def test_numbers_and_quoted_values_do_not_make_a_new_kind():
    assert kind_of("b:1", "failed on tuple -4217 'x'\ntrace") == kind_of("b:1", "failed on tuple 8812 'yy'\nother")
    # An apostrophe inside a word does not open a quote.
    assert kind_of("s:2", "bolt:1's process was lost: component 'bolt' task 1") == \
        kind_of("s:2", "bolt:2's process was lost: component 'bolt' task 2")
    assert kind_of("b:1", "failed on tuple 1") != kind_of("b:2", "failed on tuple 1"), "per task"
    assert kind_of("b:1", "KeyError: 'a'") != kind_of("b:1", "ValueError: 'a'")


def test_a_value_cut_short_is_masked_to_the_end_of_the_line():
    # An emit error quotes the refused tuple, cut to a few dozen characters:
    # its quote never closes. Each sentence made a new kind (498 ERROR lines).
    a = "emitted 1 values on stream 'default', which declares 2 fields; the tuple \"['Alice said don't wo..."
    b = "emitted 1 values on stream 'default', which declares 2 fields; the tuple \"['Then the cat's gri..."
    assert kind_of("s:3", a) == kind_of("s:3", b)


def test_first_of_a_kind_logged_the_rest_counted_then_reported(caplog):
    rl = RateLimitedLog(LOG, interval=10)
    with caplog.at_level(logging.ERROR, logger=LOG.name):
        for i in range(1000):
            rl.log("bolt:1", logging.ERROR, float(i) / 1000, "bolt:1 failed on tuple %d", i)
        assert _messages(caplog) == ["bolt:1 failed on tuple 0"]
        rl.log("bolt:1", logging.ERROR, 11.0, "bolt:1 failed on tuple %d", 5000)
    msgs = _messages(caplog)
    assert msgs[1] == "bolt:1: 999 more like this in the last 11s, the last: bolt:1 failed on tuple 999"
    assert msgs[2] == "bolt:1 failed on tuple 5000", "a new interval logs the next one in full"


def test_flush_reports_what_is_still_counted(caplog):
    rl = RateLimitedLog(LOG, interval=10)
    with caplog.at_level(logging.ERROR, logger=LOG.name):
        for i in range(3):
            rl.log("s:2", logging.ERROR, 1.0, "gave up on input ['line%d']", i)
        rl.flush(2.0)
        rl.flush(3.0)
    assert len(_messages(caplog)) == 2 and "2 more like this" in _messages(caplog)[1]


def test_memory_is_bounded_by_the_number_of_kinds_remembered(caplog):
    rl = RateLimitedLog(LOG, interval=10)
    with caplog.at_level(logging.ERROR, logger=LOG.name):
        for i in range(5000):
            rl.log(f"t:{i}", logging.ERROR, 0.0, "distinct")
    assert len(rl._kinds) <= 1000


def test_a_line_budget_shows_the_first_lines_of_a_window_then_counts_the_rest():
    from multilang.shellbolt._observe.ratelog import LineBudget

    b = LineBudget(lines=3, interval=10.0)
    assert [b.take(0.0), b.take(1.0), b.take(2.0)] == [0, 0, 0]
    assert [b.take(3.0), b.take(4.0)] == [None, None] and b.dropped == 2
    assert b.take(10.5) == 2 and b.dropped == 0, "a new window reports what the last one did not show"
    assert b.take(11.0) == 0
