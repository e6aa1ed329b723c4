"""The vector files themselves: schema-valid, well-formed, citing real sections."""

import json
import re

import jsonschema
import pytest

from conform_support import ROOT
from multilang.conform import _Matcher, load_vectors

VECTOR_DIR = ROOT / "spec" / "vectors"
FILES = sorted(p for p in VECTOR_DIR.glob("*.json") if p.name != "schema.json")
VECTORS = load_vectors(VECTOR_DIR)


@pytest.fixture(scope="module")
def validator():
    schema = json.loads((VECTOR_DIR / "schema.json").read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_file_matches_schema(validator, path):
    errors = [f"{e.json_path}: {e.message[:200]}" for e in validator.iter_errors(json.loads(path.read_text(encoding="utf-8")))]
    assert not errors


def test_schema_rejects_a_bad_vector(validator):
    bad = {"vectors": [{"id": "x.y", "title": "t", "spec": ["3.6"], "role": "any", "requires": "bolt",
                        "steps": [{"expect": {}, "send": {}}]}]}
    assert list(validator.iter_errors(bad))


def test_ids_unique_and_dotted():
    ids = [v.id for v in VECTORS]
    assert len(ids) == len(set(ids))
    assert all(re.fullmatch(r"[a-z0-9-]+(\.[a-z0-9-]+)+", i) for i in ids)


def test_cited_sections_exist_in_protocol_md():
    headings = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)[ .]", (ROOT / "spec/PROTOCOL.md").read_text(encoding="utf-8"), re.M))
    cited = {s for v in VECTORS for s in v.spec}
    assert cited <= headings, cited - headings


def test_every_required_section_and_mode_is_covered():
    cited = {s for v in VECTORS for s in v.spec}
    required = {"1.1", "1.2", "1.3", "1.4", "2.2", "2.3", "3.1", "3.2", "3.3", "3.4", "3.5", "3.6", "3.7",
                "4.1", "4.2", "4.3", "4.4", "4.5", "5.1", "5.4", "6.2"}
    assert required <= cited, required - cited
    assert {v.requires for v in VECTORS} == {"protocol", "bolt", "basic", "spout", "stateful"}
    assert {v.role for v in VECTORS} == {"any", "bolt", "spout"}


def _m(pattern, value, ids=None, last=None):
    return _Matcher(ids or {}, [last]).match(pattern, value)


@pytest.mark.parametrize(
    "pattern,value,ok",
    [
        (1, 1, True),
        (1, 1.0, False),
        (1, True, False),
        ("42", 42, False),
        ({"a": 1}, {"a": 1, "b": 2}, True),  # objects are open
        ({"$exact": {"a": 1}}, {"a": 1, "b": 2}, False),
        ({"$exact": {"k": [5]}}, {"k": [5]}, True),
        ({"$exact": 0}, 0.0, False),
        ({"s": {"$absent-or": [None, "default"]}}, {}, True),
        ({"s": {"$absent-or": [None, "default"]}}, {"s": None}, True),
        ({"s": {"$absent-or": [None, "default"]}}, {"s": "other"}, False),
        ({"s": {"$absent": True}}, {"s": 1}, False),
        ({"s": {"$one-of": [{"$absent": True}, 1]}}, {}, True),
        ({"$type": "number"}, 3, True),
        ({"$type": "integer"}, 3.5, False),
        ({"$type": ["string", "null"]}, None, True),
        ({"$contains": "boom"}, "a boom b", True),
        ({"$regex": "^x+$"}, "xxx", True),
        ({"$array-of": {"$type": "string"}}, ["a", 1], False),
        ({"$any": True}, None, True),
        ({"$literal": {"$any": True}}, {"$any": True}, True),
        ([1, 2], [1, 2, 3], False),
        ("$same-as-sent-id", "17", True),
        ("$same-as-sent-id", 17, False),
        ({"$same-as-sent-id": "t"}, "-5", True),
        ({"$same-as-sent-id": "t"}, "-05", False),
    ],
)
def test_patterns(pattern, value, ok):
    why = _m(pattern, value, ids={"t": "-5"}, last="17")
    assert (why is None) == ok, why


# -- levels (spec/CONFORMANCE.md "Levels") --------------------------------------

LEVELS = ("required", "recommended", "extension")


def test_every_vector_has_a_level_and_extension_goes_with_it():
    for path in FILES:
        for raw in json.loads(path.read_text(encoding="utf-8"))["vectors"]:
            assert raw.get("level") in LEVELS, raw["id"]
            assert (raw["level"] == "extension") == ("extension" in raw), raw["id"]


def test_schema_requires_the_level(validator):
    vec = {"id": "x.y", "title": "t", "spec": ["3.6"], "role": "bolt", "requires": "protocol", "steps": []}
    assert list(validator.iter_errors({"vectors": [vec]}))
    assert not list(validator.iter_errors({"vectors": [{**vec, "level": "recommended"}]}))
    assert list(validator.iter_errors({"vectors": [{**vec, "level": "extension"}]}))  # needs "extension"
    assert list(validator.iter_errors({"vectors": [{**vec, "level": "required", "extension": "batch"}]}))


def _conformance_md_levels():
    text = (ROOT / "spec/CONFORMANCE.md").read_text(encoding="utf-8")
    lists = {}
    for level, body in re.findall(r"^### Vectors at level (\w+) \(\d+\)\n(.*?)(?=^#)", text, re.M | re.S):
        lists[level] = [i for i in re.findall(r"`([a-z0-9-]+(?:\.[a-z0-9-]+)+)`", body) if not i.endswith(".json")]
    return lists, {lv: int(n) for lv, n in re.findall(r"^### Vectors at level (\w+) \((\d+)\)", text, re.M)}


def test_conformance_md_lists_every_vector_at_its_level():
    lists, counts = _conformance_md_levels()
    assert set(lists) == set(LEVELS)
    for level in LEVELS:
        want = sorted(v.id for v in VECTORS if v.level == level)
        assert sorted(lists[level]) == want, f"spec/CONFORMANCE.md, level {level}: {set(lists[level]) ^ set(want)}"
        assert counts[level] == len(want)


def test_storm_never_relies_on_the_recommended_readings():
    # Storm's host writes compact JSON + "\nend\n" only, never sends unknown
    # commands, never reads the pid file and ignores the exit status.
    by_id = {v.id: v for v in VECTORS}
    for vid in ("framing.crlf", "framing.split-crlf", "framing.lone-cr", "framing.lone-cr-end-of-write",
                "framing.multiline-mixed", "framing.multiline-json", "handshake.multiline-crlf",
                "handshake.pid-file", "spout.unknown-command-sync", "eof.exit-status", "spout.framing-liberal"):
        assert by_id[vid].level == "recommended", vid
    for v in VECTORS:
        if v.level != "recommended":
            # no exit-status requirement, no CR/CRLF/indent in what a required check sends
            for step in v.steps:
                if any("close_stdin" in s for s in v.steps):  # bolt-api.exit checks the exit action's status
                    assert step.get("expect_exit", None) is None, (v.id, step)
                assert step.get("line_ending", "\n") == "\n" and "indent" not in step, (v.id, step)
                assert "\r" not in json.dumps(step.get("send_raw", "")).replace("\\\\r", ""), (v.id, step)
            hs = v.handshake if isinstance(v.handshake, dict) else {}
            assert hs.get("line_ending", "\n") == "\n" and "indent" not in hs, v.id
            assert not any(s.get("check") == "pid-file" for s in v.steps), v.id
