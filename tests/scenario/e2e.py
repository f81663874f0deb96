"""What the end-to-end scenario tests share: failures collected (every check runs, the test
fails at the end with all of them), one scenario run with its result JSON checked against the
schema, a metric's value, and the exit.
"""
import json
import os
import subprocess
import sys

import schema_check

failures = []


def check(cond, msg):
    """Records msg as a failure when cond is false; returns cond, so a dependent check can be skipped."""
    if not cond:
        failures.append(msg)
    return cond


def run_scenario(exe, schema, tmp, scenario, name, args, want_rc=0, tail=3000):
    """`stallbench run SCENARIO --json TMP/NAME.json ARGS`: its exit code checked against want_rc; on
    exit 0, the JSON against the schema and every point's status ok. Returns (process, doc), doc None
    when it did not exit 0."""
    out = os.path.join(tmp, name + ".json")
    p = subprocess.run([exe, "run", scenario, "--json", out] + args, capture_output=True, text=True, timeout=600)
    print(p.stdout[-tail:])
    check(p.returncode == want_rc, f"{name}: exit {p.returncode}, want {want_rc}: {p.stderr[-800:]}")
    if p.returncode != 0:
        return p, None
    with open(out) as f:
        doc = json.load(f)
    errs = schema_check.errors(doc, schema)
    check(not errs, f"{name}: schema {errs[:3]}")
    for q in doc["points"]:
        check(q["status"] == "ok", f"{name}: {q['params']} {q['status']} {q.get('reason')}")
    return p, doc


def m(q, name):
    """A point's metric value."""
    return q["metrics"][name]["value"]


def finish():
    """Exit 1 listing every failure, else print ok."""
    if failures:
        print("\n".join("FAIL: " + f for f in failures))
        sys.exit(1)
    print("ok")
