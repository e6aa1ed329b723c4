"""Malformed topology files for the fuzz tests: examples/wordcount.toml with
one to three mutations (a misspelled key, a wrong value, a dropped key, an
added key, a nesting, a conf key with any value), each a file a user could
write. ``check`` says what the loader makes of one.

Used by tests/unit/test_validation.py (2,000 files, in process) and
tests/integration/test_cli_fuzz.py (a sample through the real CLI).
"""

from __future__ import annotations

import copy
import json
import math
import random
import tomllib
from pathlib import Path

from multilang.errors import TopologyError
from multilang.shellbolt import Runtime
from multilang.shellbolt._model.conf import SCHEMA
from multilang.shellbolt._model.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
WORDCOUNT_TEXT = (EXAMPLES / "wordcount.toml").read_text()

_BASE_DOC = tomllib.loads(WORDCOUNT_TEXT)
_BAD_VALUES = ["abc", "word", "", -1, 0, 1, -0.5, 0.0, 1.5, 10**18, 2**63 - 1, -2**63, 1e308, math.nan,
               math.inf, -math.inf, True, False, [], [1], ["x"], ["batch", "batch"], ["zip"], {}, {"a": 1},
               {"a": {"b": [1, {"c": "d"}]}}, [[["deep"]]], "__x", "python"]
_ADDED_KEYS = ["extra", "groupping", "keys", "cnf", "parallelism", "fields", "conf", "streams", "env", "cwd",
               "name", "inputs", "stream", "source", "key"]


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return "{ " + ", ".join(f"{json.dumps(str(k))} = {_toml_value(x)}" for k, x in v.items()) + " }"


def _to_toml(doc: dict) -> str:
    return "".join(f"{json.dumps(k)} = {_toml_value(v)}\n" for k, v in doc.items())


def _typo(rng: random.Random, word: str) -> str:
    if not word:
        return "x"
    i = rng.randrange(len(word))
    op = rng.randrange(5)
    if op == 0:
        return word[:i] + word[i + 1:]
    if op == 1 and len(word) > 1:
        i = min(i, len(word) - 2)
        return word[:i] + word[i + 1] + word[i] + word[i + 2:]
    if op == 2:
        return word[:i] + word[i] + word[i:]
    if op == 3:
        return word[:i] + rng.choice("aeiouxz._") + word[i:]
    return word + "s"


def _slots(node, out: list) -> list:
    """Every (container, key-or-index) in the document tree."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in list(items):
        out.append((node, k))
        _slots(v, out)
    return out


def _conf_tables(doc: dict) -> list[dict]:
    holders = [doc.get("topology")]
    for kind in ("spouts", "bolts"):
        if isinstance(doc.get(kind), dict):
            holders += list(doc[kind].values())
    return [h.setdefault("conf", {}) for h in holders if isinstance(h, dict) and isinstance(h.get("conf", {}), dict)]


def _mutate(rng: random.Random, doc: dict) -> None:
    op = rng.randrange(6)
    slots = _slots(doc, [])
    if op == 5 or not slots:  # a conf key (maybe misspelled) gets any value
        tables = _conf_tables(doc)
        if tables:
            key = rng.choice(sorted(SCHEMA))
            rng.choice(tables)[_typo(rng, key) if rng.random() < 0.2 else key] = copy.deepcopy(
                rng.choice(_BAD_VALUES))
        return
    container, key = rng.choice(slots)
    if op == 0 and isinstance(container, dict):
        container[_typo(rng, key)] = container.pop(key)                   # a misspelled key
    elif op == 1:
        container[key] = copy.deepcopy(rng.choice(_BAD_VALUES))            # a wrong value
    elif op == 2:
        del container[key]                                                 # a dropped key
    elif op == 3 and isinstance(container, dict):
        container[rng.choice(_ADDED_KEYS + [_typo(rng, str(key))])] = copy.deepcopy(rng.choice(_BAD_VALUES))
    elif op == 4:
        container[key] = {"nested": container[key]} if rng.random() < 0.5 else [container[key]]


def mutant(seed: int) -> str:
    """examples/wordcount.toml (commands run in examples/) with 1-3 mutations."""
    rng = random.Random(seed)
    doc = copy.deepcopy(_BASE_DOC)
    for kind in ("spouts", "bolts"):
        for spec in doc[kind].values():
            spec["cwd"] = str(EXAMPLES)
    for _ in range(rng.randint(1, 3)):
        _mutate(rng, doc)
    return _to_toml(doc)


def check(path: Path) -> str | None:
    """None if the file loads and a Runtime can be built, else the
    TopologyError message. Any other exception fails the test."""
    try:
        Runtime(load_topology(path))
    except TopologyError as exc:
        msg = str(exc)
        assert msg.startswith(str(path)), msg  # names the file
        return msg
    return None
