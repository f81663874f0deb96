#!/usr/bin/env python3
"""The built-in schema validator (used where jsonschema is absent: the GPU machine) against
jsonschema itself, on every published result and on broken copies of each.

    test_schema_check.py RESULT_SCHEMA PUBLISHED_DIR EXPECTED_SCHEMA EXPECTED_DIR

Every published result and every expected-numbers file is valid against its schema, with
both validators, so nothing published can rot unnoticed.

Both must accept every published result, and both must reject each mutation. Exit 77 when
jsonschema is not installed here: there is then no peer to compare with (scripts/setup
installs it, so CI always compares).
"""
import copy
import glob
import json
import os
import sys

import schema_check

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)


def mutations(doc):
    """(name, broken copy) pairs, each breaking one rule of the schema."""
    out = []

    def mut(name, fn):
        d = copy.deepcopy(doc)
        try:
            fn(d)
        except (KeyError, IndexError, TypeError):
            return  # this result has no such field
        out.append((name, d))

    mut("schema_version 2", lambda d: d.__setitem__("schema_version", 2))
    mut("kind not result", lambda d: d.__setitem__("kind", 5))
    mut("meta missing", lambda d: d.pop("meta"))
    mut("extra top-level key", lambda d: d.__setitem__("surprise", 1))
    mut("device id pattern", lambda d: d["meta"]["device"].__setitem__("id", "gpu0"))
    mut("device kind enum", lambda d: d["meta"]["device"].__setitem__("kind", "tpu"))
    mut("simulated as a string", lambda d: d["meta"]["device"].__setitem__("simulated", "yes"))
    mut("time_utc pattern", lambda d: d["meta"].__setitem__("time_utc", "yesterday"))
    mut("logical_cores negative", lambda d: d["meta"]["cpu"].__setitem__("logical_cores", -1))
    mut("budget_s zero", lambda d: d["meta"]["measure"].__setitem__("budget_s", 0))
    mut("points not a list", lambda d: d.__setitem__("points", {}))
    mut("point status enum", lambda d: d["points"][0].__setitem__("status", "fine"))
    mut("point params missing", lambda d: d["points"][0].pop("params"))
    mut("metric unit missing", lambda d: d["points"][0]["metrics"][0].pop("unit"))
    mut("metric value a string", lambda d: d["points"][0]["metrics"][0].__setitem__("value", "fast"))
    mut("stats n a string", lambda d: d["points"][0]["metrics"][0]["stats"].__setitem__("n", "3"))
    mut("finding cause missing", lambda d: d["findings"][0].pop("cause"))
    return out


def expected_mutations(doc):
    out = []

    def mut(name, fn):
        d = copy.deepcopy(doc)
        try:
            fn(d)
        except (KeyError, IndexError, TypeError):
            return
        out.append((name, d))

    mut("class 5", lambda d: d["hardware"].__setitem__("class", 5))
    mut("class tpu", lambda d: d["hardware"].__setitem__("class", "tpu"))
    mut("peak without source", lambda d: d["peaks"]["tflops"][next(iter(d["peaks"]["tflops"]))].pop("source"))
    mut("figure without source", lambda d: d["figures"][0].pop("source"))
    mut("figure value negative", lambda d: d["figures"][0].__setitem__("value", -1))
    mut("figure direction none", lambda d: d["figures"][0].__setitem__("direction", "none"))
    mut("figure kind guessed", lambda d: d["figures"][0].__setitem__("kind", "guessed"))
    mut("unknown peak dtype", lambda d: d["peaks"].setdefault("tflops", {}).__setitem__(
        "int4", {"value": 1, "unit": "TFLOP/s", "kind": "datasheet", "source": "x"}))
    return out


def check_both(doc, schema, name, mutate):
    """Both validators accept doc and reject each of its mutations. Returns the mutations tried."""
    os.environ.pop("STALLBENCH_SCHEMA_BUILTIN", None)
    peer = schema_check.errors(doc, schema)
    os.environ["STALLBENCH_SCHEMA_BUILTIN"] = "1"
    ours = schema_check.errors(doc, schema)
    check(not peer, f"{name}: jsonschema rejects it: {peer[:2]}")
    check(not ours, f"{name}: the built-in validator rejects it: {ours[:2]}")
    n = 0
    for what, broken in mutate(doc):
        os.environ.pop("STALLBENCH_SCHEMA_BUILTIN", None)
        peer = schema_check.errors(broken, schema)
        os.environ["STALLBENCH_SCHEMA_BUILTIN"] = "1"
        ours = schema_check.errors(broken, schema)
        n += 1
        check(bool(peer), f"{name} / {what}: jsonschema accepts it (the mutation breaks nothing)")
        check(bool(ours), f"{name} / {what}: the built-in validator accepts what jsonschema rejects: {peer[:1]}")
    os.environ.pop("STALLBENCH_SCHEMA_BUILTIN", None)
    return n


def main():
    schema_path, published = sys.argv[1], sys.argv[2]
    with open(sys.argv[3]) as f:
        expected_schema = json.load(f)
    expected_files = sorted(glob.glob(os.path.join(sys.argv[4], "*.json")))
    with open(schema_path) as f:
        schema = json.load(f)
    if schema_check.validator_name() == "built-in":
        print("SKIP: jsonschema is not installed here, so there is no peer to hold the built-in validator against")
        sys.exit(77)
    files = sorted(glob.glob(os.path.join(published, "**", "*.json"), recursive=True))
    check(len(files) >= 5, f"only {len(files)} published results under {published}")
    n_mut = 0
    for path in files:
        with open(path) as f:
            doc = json.load(f)
        if doc.get("kind") != "result":
            continue
        name = os.path.relpath(path, published)
        os.environ.pop("STALLBENCH_SCHEMA_BUILTIN", None)
        peer = schema_check.errors(doc, schema)
        os.environ["STALLBENCH_SCHEMA_BUILTIN"] = "1"
        ours = schema_check.errors(doc, schema)
        check(not peer, f"{name}: jsonschema rejects a published result: {peer[:2]}")
        check(not ours, f"{name}: the built-in validator rejects a published result: {ours[:2]}")
        for what, broken in mutations(doc):
            os.environ.pop("STALLBENCH_SCHEMA_BUILTIN", None)
            peer = schema_check.errors(broken, schema)
            os.environ["STALLBENCH_SCHEMA_BUILTIN"] = "1"
            ours = schema_check.errors(broken, schema)
            n_mut += 1
            check(bool(peer), f"{name} / {what}: jsonschema accepts it (the mutation breaks nothing)")
            check(bool(ours), f"{name} / {what}: the built-in validator accepts what jsonschema rejects: {peer[:1]}")
    os.environ.pop("STALLBENCH_SCHEMA_BUILTIN", None)
    check(len(expected_files) >= 3, f"only {len(expected_files)} expected files")
    for path in expected_files:
        with open(path) as f:
            doc = json.load(f)
        name = os.path.basename(path)
        n_mut += check_both(doc, expected_schema, name, expected_mutations)
        check(doc.get("hardware", {}).get("id") == name[:-len(".json")], f"{name}: hardware.id is not the file name")
    # A keyword the built-in validator does not implement is refused, never ignored.
    os.environ["STALLBENCH_SCHEMA_BUILTIN"] = "1"
    try:
        schema_check.errors({}, {"type": "object", "propertyNames": {"maxLength": 3}})
        check(False, "an unimplemented keyword (propertyNames) was silently ignored")
    except ValueError as e:
        check("propertyNames" in str(e), f"the refusal does not name the keyword: {e}")
    os.environ.pop("STALLBENCH_SCHEMA_BUILTIN", None)
    print(f"{len(files)} published results, {len(expected_files)} expected files, {n_mut} mutations, "
          "both validators agree"
          if not failures else "")
    if failures:
        for f in failures:
            print("FAIL:", f)
        sys.exit(1)


if __name__ == "__main__":
    main()
