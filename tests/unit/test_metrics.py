"""Metrics out (shellbolt/_observe/metrics.py, docs/OBSERVE.md "Metrics"): the
Prometheus text format and the JSON line from hand-built snapshots, the
consumers of the conf, and the HTTP endpoint answering real requests in
process (a fake snapshot: no topology)."""

from __future__ import annotations

import math
import re

import orjson
import pytest
import trio

from multilang.errors import TopologyError
from multilang.shellbolt._model.conf import check_value
from multilang.shellbolt._observe.metrics import (
    CONTENT_TYPE, MetricsReporter, consumers_from_conf, json_line, prometheus_text,
)


def _lat(p50=None, p99=None, count=0):
    return {"p50": p50, "p99": p99, "count": count}


def _row(**kw):
    row = {"kind": "bolt", "emitted": 0, "executed": 0, "acked": 0, "failed": 0, "restarts": 0, "errors": 0,
           "in_flight": 0, "queued": 0, "execute_latency_ms": _lat(), "capacity": None, "last_error": None,
           "extensions": [], "metrics": {}}
    row.update(kw)
    return row


def snap(**kw):
    s = {
        "topology": "wc", "elapsed_s": 12.5, "stalled": False,
        "trees": {"in_flight": 3, "completed": 100, "failed": 2, "timed_out": 1,
                  "complete_latency_ms": _lat(4.5, 20.0, 100)},
        "components": {
            "sentences": _row(kind="spout", tasks=[1], emitted=105, acked=100, failed=2),
            "split": _row(tasks=[2, 3], emitted=900, executed=100, acked=100, execute_latency_ms=_lat(1.0, 2.5, 100),
                          capacity=0.25, extensions=["batch"], metrics={"words": 900}),
        },
        "tasks": {
            "sentences:1": _row(kind="spout", component="sentences", task=1, pid=11, emitted=105, acked=100, failed=2),
            "split:2": _row(component="split", task=2, pid=12, emitted=500, executed=60, acked=60,
                            execute_latency_ms=_lat(1.0, 2.5, 60), capacity=0.25, extensions=["batch"],
                            metrics={"words": 500}),
            "split:3": _row(component="split", task=3, pid=13, emitted=400, executed=40, acked=40,
                            execute_latency_ms=_lat(1.25, 2.0, 40), capacity=0.125, extensions=["batch"],
                            metrics={"words": 400, "lat": {"p50": 1.5, "by": {"x": 2}, "name": "s", "list": [1]}}),
        },
    }
    s.update(kw)
    return s


# One line of the 0.0.4 text format: a comment, or name{labels} value.
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\\\|\\"|\\n)*"'
_SAMPLE = re.compile(rf'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{{(?:{_LABEL}(?:,{_LABEL})*)?\}})? '
                     r'(NaN|[+-]Inf|-?[0-9.]+(?:e[+-]?[0-9]+)?)$')
_HELP = re.compile(r"^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) (?:[^\\\n]|\\\\|\\n)*$")
_TYPE = re.compile(r"^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|summary|histogram|untyped)$")


def parse(text):
    """{family: (type, [(labels dict, value)])}, checking the grammar and that
    HELP and TYPE come once per family, before its samples, which are contiguous."""
    assert text.endswith("\n")
    fams, order, current = {}, [], None
    for line in text[:-1].split("\n"):
        if line.startswith("# HELP "):
            name = _HELP.match(line).group(1)
            assert name not in fams, f"HELP twice for {name}"
            fams[name] = [None, []]
            order.append(name)
            current = name
        elif line.startswith("# TYPE "):
            m = _TYPE.match(line)
            assert m and m.group(1) == current and fams[current][0] is None, line
            fams[current][0] = m.group(2)
        else:
            m = _SAMPLE.match(line)
            assert m, f"not a sample line: {line!r}"
            assert m.group(1) == current, f"{m.group(1)} outside its family ({current})"
            labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', line.split(" ")[0]
                                     if "{" not in line else line[line.index("{"):line.rindex("}") + 1]))
            value = m.group(2)
            fams[current][1].append((labels, float(value.replace("Inf", "inf"))))
    return {k: (t, s) for k, (t, s) in fams.items()}


def value(fams, name, **labels):
    hits = [v for ls, v in fams[name][1] if all(ls.get(k) == str(w) for k, w in labels.items())]
    assert len(hits) == 1, (name, labels, fams[name][1])
    return hits[0]


def test_the_documented_families_with_help_and_type_once():
    fams = parse(prometheus_text(snap()))
    counters = {"multilang_tuples_emitted_total", "multilang_tuples_acked_total", "multilang_tuples_failed_total",
                "multilang_tuples_executed_total", "multilang_process_restarts_total",
                "multilang_component_errors_total", "multilang_trees_completed_total",
                "multilang_trees_failed_total", "multilang_trees_timed_out_total"}
    gauges = {"multilang_trees_in_flight", "multilang_execute_latency_ms", "multilang_complete_latency_ms",
              "multilang_capacity", "multilang_component_metric", "multilang_uptime_seconds",
              "multilang_tuples_in_flight", "multilang_tuples_queued", "multilang_component_info", "multilang_stalled"}
    assert {k for k, (t, _) in fams.items() if t == "counter"} == counters
    assert {k for k, (t, _) in fams.items() if t == "gauge"} == gauges
    assert all(k.endswith("_total") for k in counters)
    assert all(k.startswith("multilang_") for k in fams)


def test_values_and_labels_per_task():
    fams = parse(prometheus_text(snap()))
    assert value(fams, "multilang_uptime_seconds", topology="wc") == 12.5
    assert value(fams, "multilang_trees_completed_total") == 100
    assert value(fams, "multilang_trees_timed_out_total") == 1
    assert value(fams, "multilang_trees_in_flight") == 3
    assert value(fams, "multilang_stalled") == 0
    assert value(fams, "multilang_complete_latency_ms", quantile="0.99") == 20.0
    assert value(fams, "multilang_tuples_emitted_total", component="split", task=2) == 500
    assert value(fams, "multilang_tuples_emitted_total", component="split", task=3) == 400
    assert value(fams, "multilang_tuples_acked_total", component="sentences", task=1) == 100
    assert value(fams, "multilang_execute_latency_ms", component="split", task=3, quantile="0.5") == 1.25
    assert value(fams, "multilang_capacity", component="split", task=3) == 0.125
    # every per-task sample has the three labels, and no component-level row doubles them
    for name in ("multilang_tuples_emitted_total", "multilang_tuples_acked_total", "multilang_capacity"):
        for labels, _ in fams[name][1]:
            assert {"topology", "component", "task"} <= set(labels)
    assert len(fams["multilang_tuples_emitted_total"][1]) == 3
    assert value(fams, "multilang_component_info", component="split") == 1
    assert [ls for ls, _ in fams["multilang_component_info"][1] if ls["component"] == "split"][0] == {
        "topology": "wc", "component": "split", "kind": "bolt", "extensions": "batch"}


def test_none_is_left_out_and_nan_and_infinities_are_written_as_the_format_says():
    s = snap()
    s["tasks"]["split:2"]["capacity"] = None
    s["tasks"]["split:2"]["execute_latency_ms"] = _lat()
    s["tasks"]["split:3"]["capacity"] = math.nan
    s["tasks"]["split:3"]["metrics"] = {"big": math.inf, "small": -math.inf, "ok": True, "none": None, "n": 3}
    s["trees"]["complete_latency_ms"] = _lat()
    text = prometheus_text(s)
    fams = parse(text)
    assert [ls["task"] for ls, _ in fams["multilang_capacity"][1]] == ["3"]
    assert 'multilang_capacity{topology="wc",component="split",task="3"} NaN' in text
    assert fams["multilang_complete_latency_ms"] == ("gauge", [])  # HELP and TYPE, no sample
    assert not [ls for ls, _ in fams["multilang_execute_latency_ms"][1] if ls["task"] == "2"]
    assert 'name="big",key=""} +Inf' in text and 'name="small",key=""} -Inf' in text
    metric_names = {ls["name"] for ls, _ in fams["multilang_component_metric"][1]}
    assert metric_names == {"big", "small", "n", "words"}  # a bool and a null are not numbers: skipped


def test_numbers():
    s = snap(elapsed_s=0.1)
    s["tasks"]["split:2"]["emitted"] = 2**70
    text = prometheus_text(s)
    assert "multilang_uptime_seconds{topology=\"wc\"} 0.1\n" in text
    assert f'task="2"}} {2**70}\n' in text  # an int stays exact
    s = snap(elapsed_s=1e-7)
    assert 'multilang_uptime_seconds{topology="wc"} 1e-07\n' in prometheus_text(s)
    parse(prometheus_text(s))


def test_label_values_are_escaped():
    weird = 'a"b\\c\nd'
    s = snap(topology=weird)
    s["components"][weird] = s["components"].pop("split")
    for key in ("split:2", "split:3"):
        s["tasks"][key]["component"] = weird
    s["tasks"]["split:2"]["metrics"] = {weird: {weird: 1}}
    text = prometheus_text(s)
    fams = parse(text)
    esc = 'a\\"b\\\\c\\nd'
    assert f'topology="{esc}",component="{esc}",task="2"}} 500' in text
    assert f'name="{esc}",key="{esc}"}} 1' in text
    assert "\nd" not in text.replace("\\nd", "")  # no raw newline inside a label


def test_component_metrics_numbers_and_flattened_dicts():
    fams = parse(prometheus_text(snap()))
    samples = {(ls["component"], ls.get("task"), ls["name"], ls["key"]): v
               for ls, v in fams["multilang_component_metric"][1]}
    assert samples == {
        ("split", "2", "words", ""): 500, ("split", "3", "words", ""): 400,
        ("split", "3", "lat", "p50"): 1.5, ("split", "3", "lat", "by.x"): 2,  # nested: dotted key
    }  # strings and lists are skipped


def test_component_metrics_kept_per_component_are_exported_once_without_a_task():
    s = snap()
    for key in ("split:2", "split:3"):
        s["tasks"][key]["metrics"] = {}
    fams = parse(prometheus_text(s))
    assert fams["multilang_component_metric"][1] == [
        ({"topology": "wc", "component": "split", "name": "words", "key": ""}, 900)]


def test_a_component_without_task_rows_gets_one_row():
    s = snap(tasks={})
    fams = parse(prometheus_text(s))
    assert value(fams, "multilang_tuples_emitted_total", component="split") == 900
    assert all("task" not in ls for ls, _ in fams["multilang_tuples_emitted_total"][1])


def test_an_empty_snapshot_still_parses():
    fams = parse(prometheus_text({"topology": "t", "elapsed_s": 0.0, "trees": {}, "components": {}, "tasks": {}}))
    assert fams["multilang_uptime_seconds"][1] == [({"topology": "t"}, 0.0)]


def test_the_json_line():
    s = snap()
    s["tasks"]["split:2"]["metrics"] = {"nan": math.nan, "raw": b"\xff\x00", 7: "int key"}
    line = json_line(s, 1700000000.12345)
    assert "\n" not in line
    doc = orjson.loads(line)
    assert list(doc) == ["ts", "elapsed_s", "topology", "components", "tasks", "trees"]
    assert doc["ts"] == 1700000000.123 and doc["elapsed_s"] == 12.5 and doc["topology"] == "wc"
    assert doc["components"]["split"]["emitted"] == 900 and doc["trees"]["completed"] == 100
    assert doc["tasks"]["split:2"]["metrics"] == {"nan": None, "raw": "\\xff\x00", "7": "int key"}


# --- the conf -------------------------------------------------------------------------------------


def test_consumers_from_conf():
    specs = consumers_from_conf([{"class": "json", "argument": "m.jsonl"}, {"class": "prometheus", "argument": 9464},
                                 {"class": "prometheus", "argument": "0.0.0.0:9465", "parallelism.hint": 1}])
    assert [(c.kind, c.path, c.host, c.port) for c in specs] == [
        ("json", "m.jsonl", "127.0.0.1", None), ("prometheus", None, "127.0.0.1", 9464),
        ("prometheus", None, "0.0.0.0", 9465)]
    assert consumers_from_conf(None) == []


def test_a_storm_java_consumer_of_a_flux_file_is_skipped_with_a_warning(caplog):
    """Flux files register Storm's Java consumers; the file must still run."""
    conf = [{"class": "org.apache.storm.metric.LoggingMetricsConsumer", "parallelism.hint": 1},
            {"class": "json", "argument": "m.jsonl"}]
    assert check_value("topology.metrics.consumer.register", conf) is None
    with caplog.at_level("WARNING", logger="multilang.shellbolt"):
        specs = consumers_from_conf(conf)
    assert [c.kind for c in specs] == ["json"]
    assert "org.apache.storm.metric.LoggingMetricsConsumer cannot run here and is skipped" in caplog.text


@pytest.mark.parametrize("bad, said", [
    ([{"class": "LoggingMetricsConsumer"}], "unknown consumer class"),
    ([{"class": "json"}], "class 'json' takes a file path"),
    ([{"class": "prometheus", "argument": 70000}], "class 'prometheus' takes a port"),
    ([{"class": "prometheus", "argument": "host"}], "class 'prometheus' takes a port"),
    ([{"class": "json", "argument": "f", "extra": 1}], "not ['extra']"),
    (["json"], "each consumer is a table"),
])
def test_a_bad_consumer_is_refused_naming_the_key(bad, said):
    with pytest.raises(TopologyError, match=r"topology\.metrics\.consumer\.register\[0\]: ") as info:
        consumers_from_conf(bad)
    assert said in str(info.value)
    assert check_value("topology.metrics.consumer.register", bad).startswith(
        "conf key 'topology.metrics.consumer.register' must be a list of tables {class = 'json'")


def test_a_reporter_from_conf_and_options(tmp_path):
    conf = {"topology.builtin.metrics.bucket.size.secs": 0.5,
            "topology.metrics.consumer.register": [{"class": "json", "argument": str(tmp_path / "a.jsonl")}]}
    r = MetricsReporter.from_conf(conf, file=str(tmp_path / "b.jsonl"), port=0)
    try:
        assert r.interval == 0.5 and len(r._files) == 2 and r.endpoints[0][0] == "127.0.0.1" and r.endpoints[0][1]
    finally:
        r.close()
    with pytest.raises(TopologyError, match=r"^--metrics-file .*/no/such/f\.jsonl: No such file or directory$"):
        MetricsReporter.from_conf({}, file=str(tmp_path / "no" / "such" / "f.jsonl"))
    with pytest.raises(TopologyError, match="--metrics-port: host 'no.such.host.invalid'"):
        MetricsReporter.from_conf({}, port=0, host="no.such.host.invalid")


def test_a_port_in_use_is_refused_naming_the_option():
    first = MetricsReporter.from_conf({}, port=0)
    try:
        port = first.endpoints[0][1]
        with pytest.raises(TopologyError, match=rf"^--metrics-port {port}: cannot listen on 127.0.0.1:{port}: "
                                                r"Address already in use$"):
            MetricsReporter.from_conf({}, port=port)
    finally:
        first.close()


# --- the endpoint, in process -------------------------------------------------------------------------


async def _request(port: int, raw: bytes) -> tuple[str, dict[str, str], bytes]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(raw)
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)}
    return status, headers, body


def test_the_endpoint_answers_get_metrics_and_nothing_else():
    calls = []

    def fake(runtime):
        calls.append(runtime)
        return snap()

    reporter = MetricsReporter(snapshot=fake)
    reporter.add_endpoint("127.0.0.1", 0)
    port = reporter.endpoints[0][1]
    out = {}

    async def main():
        async with trio.open_nursery() as n:
            n.start_soon(reporter.run, "RT")
            out["get"] = await _request(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n")
            out["query"] = await _request(port, b"GET /metrics?x=1 HTTP/1.0\r\n\r\n")
            out["head"] = await _request(port, b"HEAD /metrics HTTP/1.1\r\n\r\n")
            out["404"] = await _request(port, b"GET / HTTP/1.1\r\n\r\n")
            out["405"] = await _request(port, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
            out["400"] = await _request(port, b"hello\r\n\r\n")
            out["431"] = await _request(port, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n")
            n.cancel_scope.cancel()
        reporter.close()

    trio.run(main)
    status, headers, body = out["get"]
    assert status == "HTTP/1.1 200 OK" and headers["content-type"] == CONTENT_TYPE == \
        "text/plain; version=0.0.4; charset=utf-8"
    assert int(headers["content-length"]) == len(body) and headers["connection"] == "close"
    assert body.decode() == prometheus_text(snap()) and calls[0] == "RT"
    assert out["query"][0] == "HTTP/1.1 200 OK"
    assert out["head"][0] == "HTTP/1.1 200 OK" and out["head"][2] == b"" and int(out["head"][1]["content-length"]) > 0
    assert out["404"][0] == "HTTP/1.1 404 Not Found"
    assert out["405"][0] == "HTTP/1.1 405 Method Not Allowed"
    assert out["400"][0] == "HTTP/1.1 400 Bad Request"
    assert out["431"][0] == "HTTP/1.1 431 Request Header Fields Too Large"


def test_a_failing_snapshot_is_a_500_not_a_crash(tmp_path):
    def broken(runtime):
        raise RuntimeError("boom")

    reporter = MetricsReporter(snapshot=broken)
    reporter.add_endpoint("127.0.0.1", 0)
    reporter.add_file(str(tmp_path / "m.jsonl"))
    port = reporter.endpoints[0][1]
    out = {}

    async def main():
        async with trio.open_nursery() as n:
            n.start_soon(reporter.run, None)
            out["r"] = await _request(port, b"GET /metrics HTTP/1.1\r\n\r\n")
            out["again"] = await _request(port, b"GET /metrics HTTP/1.1\r\n\r\n")  # still serving
            n.cancel_scope.cancel()
        reporter.close("RT")  # the last line's snapshot fails too: logged, not raised

    trio.run(main)
    assert out["r"][0] == out["again"][0] == "HTTP/1.1 500 Internal Server Error"
    assert b"boom" in out["r"][2]
    assert (tmp_path / "m.jsonl").read_text() == ""


def test_the_file_gets_a_line_per_interval_and_a_last_one(tmp_path):
    n_calls = []

    def fake(runtime):
        n_calls.append(1)
        return snap(elapsed_s=float(len(n_calls)))

    path = tmp_path / "m.jsonl"
    path.write_text('{"earlier": "run"}\n')  # appended to, not replaced
    reporter = MetricsReporter(interval=1.0, snapshot=fake)
    reporter.add_file(str(path))

    async def main():
        with trio.move_on_after(3.5):
            await reporter.run("RT")
        reporter.close("RT")

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    lines = [orjson.loads(ln) for ln in path.read_text().splitlines()]
    assert lines[0] == {"earlier": "run"}
    assert [d["elapsed_s"] for d in lines[1:]] == [1.0, 2.0, 3.0, 4.0]  # 3 intervals, then the last line
