"""The attempts a Spark task gets on a local master: a local master reads no
spark.task.maxFailures (its attempts are the F of local[N,F]), so the
run's master carries the user's -c value, or 4 as a cluster's default."""

from __future__ import annotations

import pytest

from multilang.adapters.spark import task_attempts
from multilang.adapters.spark._streaming.topology import with_task_retries
from multilang.errors import TopologyError


@pytest.mark.parametrize("master, conf, expected", [
    ("local[*]", None, "local[*,4]"),
    ("local", {}, "local[1,4]"),
    ("local[2]", {"spark.task.maxFailures": "8"}, "local[2,8]"),  # (before: local[2,4], the 8 ignored)
    ("local[2]", {"spark.task.maxFailures": " 1 "}, "local[2,1]"),
    ("local[2,3]", {"spark.task.maxFailures": "8"}, "local[2,3]"),  # (the master's own F, as Spark reads it)
    ("spark://host:7077", {"spark.task.maxFailures": "8"}, "spark://host:7077"),  # (a cluster reads the key)
])
def test_a_local_master_runs_with_the_attempts_the_user_gave(master, conf, expected):
    assert with_task_retries(master, conf) == expected


@pytest.mark.parametrize("value", ["abc", "0", "-1", "1.5", "", "4x", "²"])
def test_a_number_of_attempts_spark_would_not_take_is_named(value):
    with pytest.raises(TopologyError) as e:
        task_attempts({"spark.task.maxFailures": value})
    assert str(e.value) == (f"-c spark.task.maxFailures={value}: not a number of attempts; Spark takes a whole "
                            "number of at least 1 (the default is 4)")
