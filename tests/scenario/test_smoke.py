#!/usr/bin/env python3
"""Every registered scenario, --quick, on cpu and on sim:h100: a new scenario is covered the
moment it is registered (nvbench's habit of running every benchmark as a tiny test).

    test_smoke.py STALLBENCH RESULT_SCHEMA

For each name of `stallbench list --names`, and each device: the run exits 0 (or 1 only when a
point failed with a typed status, never a crash), writes its result JSON, the result is valid
against the schema, names its scenario and device, every point has a status and every ok
point a metric with a unit and a direction, a simulated device is labelled simulated, and the
table names the scenario. Scenarios that need ranks (list --json: needs_ranks) run under
`mpirun -np 2` when this build has MPI and mpirun is on the PATH, else as one process.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import schema_check

EXE, SCHEMA_PATH = sys.argv[1], sys.argv[2]
DEVICES = ["cpu", "sim:h100"]
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "pml", "ob1", "--mca", "btl", "self,vader",
          "-np", "2"]
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
    return cond


def main():
    with open(SCHEMA_PATH) as f:
        schema = json.load(f)
    listing = json.loads(subprocess.run([EXE, "list", "--json"], capture_output=True, text=True, timeout=60,
                                        check=True).stdout)
    names = subprocess.run([EXE, "list", "--names"], capture_output=True, text=True, timeout=60,
                           check=True).stdout.split()
    check(names == [s["name"] for s in listing], f"list --names {names} != list --json")
    has_mpi = json.loads(subprocess.run([EXE, "devices", "--json"], capture_output=True, text=True, timeout=60,
                                        check=True).stdout).get("build", {}).get("features", {}).get("mpi", False)
    ranks = {s["name"]: s.get("needs_ranks", False) for s in listing}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            for dev in DEVICES:
                out = os.path.join(tmp, f"{name}-{dev.replace(':', '-')}.json")
                cmd = [EXE, "run", name, "--quick", "--device", dev, "--json", out]
                launcher = ""
                if ranks[name] and has_mpi and shutil.which("mpirun"):
                    cmd = MPIRUN + cmd
                    launcher = "mpirun -np 2 "
                tag = f"{launcher}{name} on {dev}"
                try:
                    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
                except subprocess.TimeoutExpired:
                    check(False, f"{tag}: did not finish in 600 s")
                    continue
                crashed = p.returncode < 0 or any(s in p.stderr for s in ("terminate called", "Segmentation", "Traceback"))
                check(not crashed and p.returncode in (0, 1), f"{tag}: exit {p.returncode}: {p.stderr[-800:]}")
                if not check(os.path.isfile(out), f"{tag}: no result written"):
                    continue
                with open(out) as f:
                    doc = json.load(f)
                errs = schema_check.errors(doc, schema)
                check(not errs, f"{tag}: schema ({schema_check.validator_name()}): {errs[:3]}")
                check(doc["scenario"] == name, f"{tag}: scenario {doc['scenario']}")
                check(doc["meta"]["device"]["simulated"] == dev.startswith("sim:"), f"{tag}: simulated label")
                check(doc["points"], f"{tag}: no points")
                for pt in doc["points"]:
                    if pt["status"] == "ok":
                        check(pt["metrics"] and all(m.get("unit") and m.get("direction") for m in pt["metrics"].values()),
                              f"{tag}: an ok point lacks metrics with unit and direction: {pt['params']}")
                    else:
                        check(bool(pt.get("reason")), f"{tag}: a {pt['status']} point gives no reason")
                    if pt["status"] in ("error", "hang"):
                        check(p.returncode != 0, f"{tag}: a point is {pt['status']} but the run exited 0")
                check(f"scenario: {name}" in p.stdout, f"{tag}: the table does not name the scenario")
                print(f"ok  {tag}: {len(doc['points'])} points, exit {p.returncode}")
    if failures:
        print("\n".join("FAIL: " + f for f in failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
