"""Hypothesis profiles for the whole suite, and the JVMs' and Ruby's options.

``default`` (what ``python3 -m pytest -q`` and CI run) draws the same
examples on every run (``derandomize``): the README's test command gives
the same verdict on every machine, and a property test cannot fail CI on a
draw no one has seen. ``explore`` draws new examples each run, many more:
``python3 -m pytest -q tests/unit --hypothesis-profile=explore`` hunts for
new counterexamples (found ones are kept in .hypothesis/ and replayed).

The JVMs the tests start (the shared SparkSession's, each ``multilang run
--engine spark`` driver, the standalone cluster's master, worker and
executors, the Connect servers) run each for seconds to a minute on small
inputs, where the JIT's optimising compiler and a parallel collector spend
more CPU than they save: ``JAVA_TOOL_OPTIONS`` (unless already set) keeps
them to the first compiler tier and the serial collector. Measured on the
2-core machine, ``tests/spark -n 2``: 455 s of CPU and 241 s of wall time
before, 300 s and 175 s after, every test passing. They also skip the
bytecode verification of the classes they load from the class path (the
installed PySpark's own jars): a SparkSession's start and a small job took
750 CPU ticks instead of 1,000 (6.3 s instead of 8.3 s), and the whole
suite, CPU-bound on 2 cores, ran 590 to 645 s without it. It is set here,
for the tests' processes only: a user's long Spark job wants the full JIT,
and verification is a user's to give up, not ours.

The Ruby processes the tests start (components, Storm's storm.rb, the
conformance runs' scripted components: thousands in a run) start without
RubyGems (``RUBYOPT=--disable-gems``, unless ``RUBYOPT`` is set): the
components need only Ruby's standard library (``json``, ``monitor``,
``io/wait``; the Ruby library's MessagePack is its own), and loading
RubyGems was most of a start, 70 ms of CPU where the rest takes 18. The
Ruby conformance tests took 7.7 s of CPU instead of 20.6.
"""

import os

import pytest
from hypothesis import settings

settings.register_profile("default", derandomize=True, deadline=None)  # a busy machine is slow, not wrong
settings.register_profile("explore", max_examples=1000)
settings.load_profile("default")

os.environ.setdefault("RUBYOPT", "--disable-gems")
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC "
                      "-XX:+UnlockDiagnosticVMOptions -XX:-BytecodeVerificationRemote")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The tests that use the one SparkSession (the ``spark`` fixture,
    tests/spark/conftest.py) go to one worker under pytest-xdist
    (``--dist loadgroup``). The Spark tests that start a driver process of
    their own do not need it, but the long ones are grouped all the same (by
    marks in their modules), with the shared session's tests ("spark") or
    the standalone cluster's ("cluster"): at most two of them at once on a
    2-core machine, each with its Spark JVMs.
    More at once starved each other: Spark gives the Python worker of a
    Connect foreachBatch a fixed 10 s to start and connect back, and under
    four JVMs that import (0.9 s of CPU) took longer, every try.

    ``tryfirst``: xdist's worker reads the ``xdist_group`` marks in its own
    hook of this name, and this file, loaded before that plugin, would
    otherwise run after it: the marks came too late, and every worker made a
    SparkSession of its own.

    The two groups are collected first: xdist hands out work in collection
    order, and the groups (several minutes each, on one worker each), handed
    out after everything else, could make the suite's tail (runs here took
    455-521 s; 468 s with the groups first). The Connect test comes last in
    its group, when the other workers are nearly done: Spark gives the
    Python worker of its foreachBatch a fixed 10 s to start."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("spark"))
    items.sort(key=lambda item: (item.get_closest_marker("xdist_group") is None,  # (stable: the rest keep their order)
                                 item.nodeid.startswith("tests/spark/test_connect.py")))
