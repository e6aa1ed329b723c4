"""shell_bolt_partition and multilang_bolts take the same options.

Each writes them out in its own signature on purpose: typed keywords with
their defaults, which help(), IDEs and type checkers show and check (the
package ships py.typed). A shared ``**options`` would state them once but
hide them from all three. This test keeps the two lists, and the defaults
of the options object they build, from drifting apart.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest

pytest.importorskip("pyspark")

from multilang.adapters import spark  # noqa: E402
from multilang.adapters.spark._engine.spec import _Options


def _keywords(fn):
    return {n: p for n, p in inspect.signature(fn).parameters.items() if p.kind is p.KEYWORD_ONLY}


def test_the_options_both_take_are_declared_alike():
    rdd, df = _keywords(spark.shell_bolt_partition), _keywords(spark.multilang_bolts)
    shared = rdd.keys() & df.keys()
    for name in shared:
        assert (rdd[name].default, rdd[name].annotation) == (df[name].default, df[name].annotation), name


def test_the_run_options_are_taken_by_both_with_their_defaults():
    rdd, df = _keywords(spark.shell_bolt_partition), _keywords(spark.multilang_bolts)
    for f in dataclasses.fields(_Options):
        if f.name == "keyed":  # set by multilang_bolts from keep=, not an option
            continue
        assert f.name in rdd and f.name in df, f.name
        assert rdd[f.name].default == df[f.name].default == f.default, f.name
