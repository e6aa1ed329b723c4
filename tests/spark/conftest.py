"""One local SparkSession for the whole test run (session-scoped fixture ``spark``).

Spark tests mark themselves with ``pytestmark = pytest.mark.spark`` (the
marker is declared in pyproject.toml), so ``-m "not spark"`` skips them.
master local[2], 4 shuffle partitions, no UI, logs at ERROR. The Python
workers use this interpreter (PYSPARK_PYTHON), so bolts run as ``python``
find the installed ``multilang`` package.
"""

from __future__ import annotations

import os
import sys
import tempfile

import pytest

_LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stdout.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


@pytest.fixture(scope="session")
def spark():
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # A loopback address avoids slow hostname lookups and the "resolves to a
    # loopback address" warning.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    log_dir = tempfile.mkdtemp(prefix="multilang-spark-log4j-")
    log_conf = os.path.join(log_dir, "log4j2.properties")
    with open(log_conf, "w") as f:
        f.write(_LOG4J)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("multilang-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "4")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j.configurationFile=file:{log_conf}")
        .config("spark.sql.streaming.stopTimeout", "10s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


#: The loggers the Spark adapters' executor log (``_worker_log``) takes over
#: in the process that runs a partition (docs/SPARK.md, "Logs").
_TAKEN_LOGGERS = ("multilang.shellbolt", "multilang.component", "multilang.spark")


@pytest.fixture(autouse=True)
def _loggers_as_they_were():
    """Tests that call a partition function in this process (the direct lane
    tests) install the executor-log handler on the multilang loggers of
    this pytest worker, as a Spark Python worker does. Put the loggers back
    after each test, so that a test after it on the same worker, Spark or
    not, sees each log record once whatever ran before it."""
    import logging

    before = {name: (list(logging.getLogger(name).handlers), logging.getLogger(name).level)
              for name in _TAKEN_LOGGERS}
    yield
    for name, (handlers, level) in before.items():
        logger = logging.getLogger(name)
        logger.handlers[:] = handlers
        logger.setLevel(level)
    engine = sys.modules.get("multilang.adapters.spark._engine.engine")
    if engine is not None:
        engine._LOG = None  # the next partition in this process installs a fresh one
