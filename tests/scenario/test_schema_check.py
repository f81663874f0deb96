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


def mutated(doc, changes):
    """(name, broken copy) for each (name, change) whose fields this document has."""
    out = []
    for name, fn in changes:
        d = copy.deepcopy(doc)
        try:
            fn(d)
        except (KeyError, IndexError, TypeError, StopIteration):
            continue  # this document has no such field
        out.append((name, d))
    return out


def first_metric(doc, with_stats=False):
    """The first metric of any point (metrics are keyed by name), with stats if asked."""
    return next(m for p in doc["points"] for m in p.get("metrics", {}).values() if not with_stats or "stats" in m)


# Each breaks one rule of result.schema.json.
RESULT_CHANGES = [
    ("schema_version 2", lambda d: d.__setitem__("schema_version", 2)),
    ("kind not result", lambda d: d.__setitem__("kind", 5)),
    ("meta missing", lambda d: d.pop("meta")),
    ("extra top-level key", lambda d: d.__setitem__("surprise", 1)),
    ("device id pattern", lambda d: d["meta"]["device"].__setitem__("id", "gpu0")),
    ("device kind enum", lambda d: d["meta"]["device"].__setitem__("kind", "tpu")),
    ("simulated as a string", lambda d: d["meta"]["device"].__setitem__("simulated", "yes")),
    ("time_utc pattern", lambda d: d["meta"].__setitem__("time_utc", "yesterday")),
    ("logical_cores negative", lambda d: d["meta"]["cpu"].__setitem__("logical_cores", -1)),
    ("budget_s zero", lambda d: d["meta"]["measure"].__setitem__("budget_s", 0)),
    ("points not a list", lambda d: d.__setitem__("points", {})),
    ("point status enum", lambda d: d["points"][0].__setitem__("status", "fine")),
    ("point params missing", lambda d: d["points"][0].pop("params")),
    ("metric unit missing", lambda d: first_metric(d).pop("unit")),
    ("metric value a string", lambda d: first_metric(d).__setitem__("value", "fast")),
    ("stats n a string", lambda d: first_metric(d, with_stats=True)["stats"].__setitem__("n", "3")),
    ("finding cause missing", lambda d: d["findings"][0].pop("cause")),
]

# Each breaks one rule of expected.schema.json.
EXPECTED_CHANGES = [
    ("class 5", lambda d: d["hardware"].__setitem__("class", 5)),
    ("class tpu", lambda d: d["hardware"].__setitem__("class", "tpu")),
    ("peak without source", lambda d: d["peaks"]["tflops"][next(iter(d["peaks"]["tflops"]))].pop("source")),
    ("figure without source", lambda d: d["figures"][0].pop("source")),
    ("figure value negative", lambda d: d["figures"][0].__setitem__("value", -1)),
    ("figure direction none", lambda d: d["figures"][0].__setitem__("direction", "none")),
    ("figure kind guessed", lambda d: d["figures"][0].__setitem__("kind", "guessed")),
    ("unknown peak dtype", lambda d: d["peaks"].setdefault("tflops", {}).__setitem__(
        "int4", {"value": 1, "unit": "TFLOP/s", "kind": "datasheet", "source": "x"})),
]


def check_both(doc, schema, name, changes):
    """Both validators accept doc and reject each mutation of it (no changes: accept only).
    Returns the mutations tried."""
    peer, ours = schema_check.errors(doc, schema), schema_check.errors(doc, schema, builtin=True)
    check(not peer, f"{name}: jsonschema rejects it: {peer[:2]}")
    check(not ours, f"{name}: the built-in validator rejects it: {ours[:2]}")
    broken_docs = mutated(doc, changes)
    for what, broken in broken_docs:
        peer, ours = schema_check.errors(broken, schema), schema_check.errors(broken, schema, builtin=True)
        check(bool(peer), f"{name} / {what}: jsonschema accepts it (the mutation breaks nothing)")
        check(bool(ours), f"{name} / {what}: the built-in validator accepts what jsonschema rejects: {peer[:1]}")
    return len(broken_docs)


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
    docs = []
    for path in files:
        with open(path) as f:
            doc = json.load(f)
        if doc.get("kind") == "result":
            docs.append((os.path.getsize(path), os.path.relpath(path, published), doc))
    # Every file is validated whole by both; the mutations (which test the validators, not the
    # files) are made on the smallest file of each scenario, measured and simulated apart: on
    # every file they took most of this test's time (41 s of 74 with 3 diagnose reports).
    mutate = {}
    for size, name, doc in sorted(docs, key=lambda x: x[0]):
        mutate.setdefault((doc.get("scenario"), doc["meta"]["device"].get("simulated")), name)
    n_mut = 0
    for size, name, doc in docs:
        n_mut += check_both(doc, schema, name, RESULT_CHANGES if name in mutate.values() else [])
    check(len(mutate) >= 9, f"mutations made on only {len(mutate)} (scenario, simulated) groups")
    check(len(expected_files) >= 3, f"only {len(expected_files)} expected files")
    for path in expected_files:
        with open(path) as f:
            doc = json.load(f)
        name = os.path.basename(path)
        n_mut += check_both(doc, expected_schema, name, EXPECTED_CHANGES)
        check(doc.get("hardware", {}).get("id") == name[:-len(".json")], f"{name}: hardware.id is not the file name")
    # A keyword the built-in validator does not implement is refused, never ignored.
    try:
        schema_check.errors({}, {"type": "object", "propertyNames": {"maxLength": 3}}, builtin=True)
    except ValueError as e:
        check("propertyNames" in str(e), f"the refusal does not name the keyword: {e}")
    else:
        check(False, "an unimplemented keyword (propertyNames) was silently ignored")
    print(f"{len(files)} published results, {len(expected_files)} expected files, {n_mut} mutations, "
          "both validators agree"
          if not failures else "")
    if failures:
        for f in failures:
            print("FAIL:", f)
        sys.exit(1)


if __name__ == "__main__":
    main()
