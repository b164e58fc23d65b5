"""Every key ferry's C++ writes into an analysis (`ferry analyze --json`, ferry.analyze) or a probe result
(`ferry probe --json`, ferry.probe) has its place in the Python classes: a key the C++ starts writing
fails here until ferry/_analyze.py learns it (as test_header.py does for the C ABI's functions)."""
import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest

import ferry
from ferry._analyze import Analysis, ProbeResult

ROOT = Path(__file__).resolve().parents[2]
TRACES = sorted((ROOT / "tests" / "trace" / "data").glob("*.json"))


def unplaced_keys(value, schema, path="", out=None):
    """The dotted paths of the keys of `value` that `schema` (a class's SCHEMA) has no place for.
    A schema is a dict of key -> schema, a dataclass, [schema] for a list of them, or a plain type for a
    value whose keys are data (dict: rule numbers, skipped reasons) or that has none."""
    out = [] if out is None else out
    if isinstance(schema, list):
        for i, item in enumerate(value or []):
            unplaced_keys(item, schema[0], f"{path}[{i}]", out)
    elif isinstance(schema, dict):
        own = schema.get("")  # {"": Dataclass, "list_field": [Other]}: a dataclass with nested objects
        if own is not None:
            nested = {k: v for k, v in schema.items() if k}
            unplaced_keys({k: v for k, v in value.items() if k not in nested}, own, path, out)
            for k, sub in nested.items():
                if k in value:
                    unplaced_keys(value[k], sub, f"{path}.{k}", out)
            return out
        for k, v in value.items():
            if k not in schema:
                out.append(f"{path}.{k}" if path else k)
            else:
                unplaced_keys(v, schema[k], f"{path}.{k}" if path else k, out)
    elif dataclasses.is_dataclass(schema):
        fields = {f.name for f in dataclasses.fields(schema)}
        out += [f"{path}.{k}" for k in value if k not in fields]
    return out


def analyses():
    out = [(trace.name, json.loads(ferry.analyze(trace).to_json())) for trace in TRACES]
    cli = os.environ.get("FERRY_CLI")
    if cli:  # the CLI's --json, the same writer (checked again in case they part)
        for trace in TRACES:
            r = subprocess.run([cli, "analyze", str(trace), "--json"], capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            out.append((f"ferry analyze {trace.name} --json", json.loads(r.stdout)))
    return out


def test_the_traces_are_there():
    assert len(TRACES) >= 2, TRACES


def test_every_key_of_an_analysis_has_a_place_in_the_python_classes():
    for name, raw in analyses():
        missing = unplaced_keys(raw, Analysis.SCHEMA)
        assert not missing, f"{name}: keys the C++ writes and ferry/_analyze.py drops: {missing}"


def test_an_analysis_carries_the_new_fields():
    a = ferry.analyze(TRACES[0])
    raw = json.loads(a.to_json())
    assert a.main_thread_rule == raw["main_thread_rule"] and a.main_thread_rule
    assert a.uncovered.idle_ms == raw["uncovered"]["idle_ms"]
    assert [n.activity for n in a.uncovered.before] == [n["activity"] for n in raw["uncovered"]["before"]]
    assert a.idle and [dataclasses.asdict(x) for x in a.idle] == raw["idle"]
    assert [f.cause for f in a.findings] == [f.get("cause", "") for f in raw["findings"]]


def test_every_key_of_a_probe_result_has_a_place_in_the_python_classes():
    r = ferry.probe("host", copy_bytes=1 << 20, iterations=1, warmup=0, pin_bytes=1 << 20)
    missing = unplaced_keys(r.raw, ProbeResult.SCHEMA)
    assert not missing, f"keys the C++ writes and ferry/_analyze.py drops: {missing}"


def test_the_check_finds_a_key_it_does_not_know():
    # The walk above must be able to fail: a key added at each level is reported with its path.
    raw = json.loads(ferry.analyze(TRACES[0]).to_json())
    raw["new_top"] = 1
    raw["findings"][0]["new_in_finding"] = 1
    raw["uncovered"]["new_in_uncovered"] = 1
    raw["uncovered"]["before"] = [{"activity": "a", "gaps": 1, "idle_ms": 1.0, "new_in_neighbour": 1}]
    raw["mean"]["new_in_step"] = 1
    assert sorted(unplaced_keys(raw, Analysis.SCHEMA)) == sorted([
        "new_top", "findings[0].new_in_finding", "uncovered.new_in_uncovered",
        "uncovered.before[0].new_in_neighbour", "mean.new_in_step"])


@pytest.mark.parametrize("cls", [Analysis, ProbeResult])
def test_the_schemas_name_only_what_the_classes_have(cls):
    # Each top-level key of a SCHEMA is an attribute the class sets (read from its source, not guessed).
    import inspect
    src = inspect.getsource(cls.__init__)
    for key in cls.SCHEMA:
        if key != "table":  # ProbeResult's table is str(result)
            assert f"self.{key}" in src, f"{cls.__name__}.SCHEMA names {key!r}, which __init__ never sets"
