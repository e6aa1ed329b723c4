"""Extension state (§9.7) in the conformance runner: the vectors of
spec/vectors/state.json against the Python library (the scripted component
in mode stateful, the count bolt, bolts that decline), the rules the core
names on a broken raw stateful bolt (tests/conformance/broken/broken_state.py),
and the Ruby and Node components once they speak mode stateful."""

import json
import shutil
from dataclasses import replace

import pytest

from conform_support import BROKEN, PY, ROOT, applicable, failures
from multilang.conform import FAILED, NOT_APPLICABLE, PASSED, load_vectors

VECTORS = load_vectors()
STATE = [v for v in VECTORS if v.file == "state"]
GENERIC = [v.id for v in STATE if v.requires == "protocol"]
CONFORMANCE = [PY, str(ROOT / "examples/python/conformance_component.py")]
COUNT = [PY, str(ROOT / "examples/python/count_bolt.py")]
ALL_EXTENSIONS = {"batch", "msgpack", "state"}


def _offered(v):
    hs = v.handshake if isinstance(v.handshake, dict) else {}
    return hs.get("extensions") or []


# -- the vectors -------------------------------------------------------------------------


def test_state_vectors_are_extension_vectors_that_offer_state():
    assert len(STATE) >= 15
    for v in STATE:
        assert v.level == "extension" and v.extension == "state", v.id
        assert "state" in _offered(v) and "9.7" in v.spec, v.id
        assert v.role == "bolt" and v.requires in ("protocol", "stateful"), v.id
    assert {"state.any.accept", "state.any.prepare-commit-rollback"} <= set(GENERIC)
    # what the brief of §9.7 asks the scripted component to show
    for topic in ("negotiate", "init-get", "prepare-exact", "commit-then-prepare", "rollback-after-prepare",
                  "rollback-before-commit", "init-chunked", "prepare-nothing-changed", "batch", "in-order"):
        assert f"state.{topic}" in {v.id for v in STATE}, topic


def test_no_other_vector_offers_state():
    assert all("state" not in _offered(v) for v in VECTORS if v.file != "state")


# -- the Python library --------------------------------------------------------------------


def test_python_scripted_component_in_mode_stateful_passes(conform):
    report = conform(CONFORMANCE + ["stateful"])
    assert (report.mode, report.lang, report.role) == ("stateful", "python", "bolt"), report.describe_component()
    ran = {r.id for r in report.results if r.status != NOT_APPLICABLE}
    assert ran == applicable(VECTORS, "bolt", "stateful")
    assert {v.id for v in STATE} <= ran
    failed, text = failures(report)
    assert not failed, text
    assert not report.warning_ids() and replace(report, strict=True).ok


def test_count_bolt_passes_the_generic_state_vectors(conform):
    report = conform(COUNT)
    assert report.mode is None
    failed, text = failures(report)
    assert not failed, text
    ran = {r.id for r in report.results if r.status != NOT_APPLICABLE}
    assert ran == applicable(VECTORS, "bolt", None, accepts=ALL_EXTENSIONS)
    assert all(report[i].status == PASSED for i in GENERIC), text


@pytest.mark.parametrize("argv", [CONFORMANCE + ["bolt"], CONFORMANCE + ["basic"],
                                  [PY, str(ROOT / "examples/python/split_bolt.py")]],
                         ids=["bolt", "basic", "split_bolt"])
def test_a_bolt_that_declines_state_gets_the_state_vectors_as_not_applicable(conform, argv):
    report = conform(argv, select="state.")
    assert {r.id for r in report.results} == {v.id for v in STATE}
    assert all(r.status == NOT_APPLICABLE for r in report.results), report.to_text()
    assert report.ok
    if report.mode is None:  # a plain bolt: the generic vectors run, and find the offer declined
        assert "does not accept extension 'state'" in report[GENERIC[0]].reason


# -- a broken raw stateful bolt: the rule ids of the core -------------------------------------


def _broken(conform, mode, **kw):
    return conform([PY, str(BROKEN / "broken_state.py"), mode], timeout=1.0, **kw)


def test_a_correct_raw_stateful_bolt_passes_the_generic_vectors(conform):
    report = _broken(conform, "good", select="state.any")
    assert report.passed == len(GENERIC), report.to_text()


@pytest.mark.parametrize(
    "mode,check,rule,contains",
    [
        ("wrong-txid", "state.any.prepare-commit-rollback", "state.order", "state prepared 2, but prepare 1 is unanswered"),
        ("unasked", "state.any.accept", "state.order", "no prepare is unanswered"),
        ("answers-commit", "state.any.prepare-commit-rollback", "state.order", "no prepare is unanswered"),
        ("twice", "state.any.prepare-commit-rollback", "state.order", "no prepare is unanswered"),
        ("put-and-delete", "state.any.prepare-commit-rollback", "state.invalid", "in both 'put' and 'delete'"),
        ("bad-delete", "state.any.init-chunked", "state.invalid", "'delete' as an array of strings"),
    ],
)
def test_broken_stateful_bolts_fail_the_named_rule(conform, mode, check, rule, contains):
    report = _broken(conform, mode, select="state.any")
    r = report[check]
    assert r.status == FAILED, report.to_text()
    assert r.rule == rule, (r.rule, r.reason)
    assert contains in r.reason, r.reason
    assert r.frames and any('"prepared"' in f for f in r.frames if f.startswith("<-")), r.frames


PLAIN = {
    "vectors": [
        {
            "id": "t.plain",
            "title": "nothing offered: a tuple is acked, and nothing else comes",
            "spec": ["9.3"], "role": "bolt", "requires": "protocol", "level": "required",
            "steps": [
                {"send": {"id": "7", "comp": "s", "stream": "default", "task": 1, "tuple": ["a"]}},
                {"expect": {"command": "ack", "id": "7"}},
                {"expect_none": 300},
            ],
        },
    ]
}


@pytest.fixture(scope="module")
def plain_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("state-vectors")
    (d / "t.json").write_text(json.dumps(PLAIN), encoding="utf-8")
    return d


@pytest.mark.parametrize(
    "mode,rule,contains",
    [
        ("good", None, None),
        ("unoffered", "handshake.extensions", "not offered"),
        ("unnegotiated", "state.negotiated", "without the state extension"),
    ],
)
def test_state_without_negotiation(conform, plain_dir, mode, rule, contains):
    r = _broken(conform, mode, vectors_dir=plain_dir)["t.plain"]
    if rule is None:
        assert r.status == PASSED, r.reason
        return
    assert (r.status, r.rule) == (FAILED, rule), r.reason
    assert contains in r.reason, r.reason


# -- Ruby and Node ---------------------------------------------------------------------------

LANGS = {"ruby": ("ruby", "examples/ruby", ".rb"), "node": ("node", "examples/node", ".js")}


def _argv(lang, name):
    exe, folder, ext = LANGS[lang]
    path = ROOT / folder / f"{name}{ext}"
    if shutil.which(exe) is None:
        pytest.skip(f"{exe} is not installed")
    if not path.exists():
        pytest.skip(f"{path.relative_to(ROOT)} does not exist")
    return [exe, str(path)]


@pytest.mark.parametrize("lang", sorted(LANGS))
def test_other_scripted_components_in_mode_stateful(conform, lang):
    report = conform(_argv(lang, "conformance_component") + ["stateful"])
    if report.mode != "stateful":
        pytest.skip(f"the {lang} conformance component has no mode stateful yet")
    assert report.lang == lang
    assert {r.id for r in report.results if r.status != NOT_APPLICABLE} == applicable(VECTORS, "bolt", "stateful")
    failed, text = failures(report)
    assert not failed, text
    assert not report.warning_ids() and replace(report, strict=True).ok


@pytest.mark.parametrize("lang", sorted(LANGS))
def test_other_count_bolts_pass_the_generic_state_vectors(conform, lang):
    report = conform(_argv(lang, "count_bolt"), select="state.any")
    if all(r.status == NOT_APPLICABLE for r in report.results):
        pytest.skip(f"the {lang} count bolt does not accept state yet")
    assert report.passed == len(GENERIC), report.to_text()
