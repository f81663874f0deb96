#!/usr/bin/env python3
"""End-to-end runs of the attention and packing scenarios on cpu, small sizes.

usage: test_attention_packing_e2e.py STALLBENCH SCHEMA
"""
import json
import os
import subprocess
import sys
import tempfile

import schema_check  # jsonschema where installed, else the strict built-in validator

EXE, SCHEMA = sys.argv[1], sys.argv[2]
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
    return cond


def run(args, want=0, timeout=600):
    p = subprocess.run([EXE, "run", *args], capture_output=True, text=True, timeout=timeout)
    check(p.returncode == want, f"{' '.join(args)}: exit {p.returncode}, want {want}: {p.stderr[-800:]}")
    return p


def load(path):
    with open(path) as f:
        doc = json.load(f)
    with open(SCHEMA) as f:
        errs = schema_check.errors(doc, json.load(f))
    check(not errs, f"{path}: schema: " + "; ".join(errs[:3]))
    return doc


with tempfile.TemporaryDirectory() as tmp:
    # Attention: naive vs flash, with a memory cap that naive's S x S cannot fit at 1024.
    out = os.path.join(tmp, "att.json")
    run(["attention", "--device", "cpu", "--quick", "-p", "seq_len=128,1024", "-p", "heads=2",
         "-p", "mem_limit_gb=0.02", "--json", out])
    if os.path.exists(out):
        doc = load(out)
        pts = {(p["params"]["seq_len"], p["params"]["impl"], p["params"]["pass"]): p for p in doc["points"]}
        for ps in ("fwd", "fwd+bwd"):
            check(pts[(128, "naive", ps)]["status"] == "ok", f"naive 128 {ps}: {pts[(128, 'naive', ps)]['status']}")
            check(pts[(1024, "naive", ps)]["status"] == "oom", f"naive 1024 {ps} under 20 MB should be oom")
            check("needs" in pts[(1024, "naive", ps)].get("reason", ""), "the oom reason names the bytes needed")
            check(pts[(1024, "flash", ps)]["status"] == "ok", f"flash 1024 {ps} fits the cap")
            f, n = pts[(128, "flash", ps)]["metrics"], pts[(128, "naive", ps)]["metrics"]
            # Flash's per-thread tiles are fixed (and grow with the core count), so compare growth:
            # from S=128 to 1024 flash adds O(S); naive's S x S would add 63 times its S=128 size.
            f_grow = pts[(1024, "flash", ps)]["metrics"]["workspace_mib"]["value"] - f["workspace_mib"]["value"]
            check(f_grow < n["workspace_mib"]["value"] * 63 / 8,
                  f"flash {ps} workspace grows by {f_grow:.3f} MiB from S=128 to 1024: not O(S)")
            check("speedup_vs_naive" in f and "memory_ratio_vs_naive" in f, "ratios over naive are reported")
        fl = pts[(1024, "flash", "fwd")]["metrics"]["tflops"]
        check(fl["unit"] == "TFLOP/s" and fl["value"] > 0, "attention TFLOP/s")
        check(any("naive runs out of memory at S=1024" in f["summary"] for f in doc["findings"]),
              f"attention finding: {[f['summary'] for f in doc['findings']]}")

    # Packing: the seeds' case (mean 256 tokens, max_len 2048) is ~87% padding under pad-max.
    out = os.path.join(tmp, "pack.json")
    p = run(["packing", "--device", "cpu", "--quick", "-p", "max_len=2048", "-p", "sequences=1024",
             "-p", "d_model=64", "--json", out])
    check("warning: concat lets examples attend to each other" in p.stdout, "concat is flagged in the table")
    if os.path.exists(out):
        doc = load(out)
        pts = {p["params"]["strategy"]: p for p in doc["points"]}
        check(all(p["status"] == "ok" for p in pts.values()), f"statuses {[(k, p['status']) for k, p in pts.items()]}")
        pad = pts["pad-max"]["metrics"]["padding_pct"]["value"]
        check(84 <= pad <= 90, f"pad-max padding {pad:.1f}%, want about 87%")
        for s in ("pack-ffd", "pack-bfd"):
            check(pts[s]["metrics"]["efficiency_pct"]["value"] > 97, f"{s} efficiency")
            check(pts[s]["metrics"]["predicted_speedup"]["value"] > 4, f"{s} predicted speedup")
        check(pts["concat"]["info"]["cross_contamination"] is True, "concat marked as cross-contaminating")
        check(any("pad-max computes" in f["summary"] for f in doc["findings"]), "packing finding")

    # A length histogram from a file (CSV length,count).
    hist = os.path.join(tmp, "hist.csv")
    with open(hist, "w") as f:
        f.write("length,count\n100,300\n400,100\n1500,20\n")
    out = os.path.join(tmp, "hist.json")
    run(["packing", "--device", "cpu", "--quick", "-p", f"lengths=@{hist}", "-p", "sequences=0",
         "-p", "strategy=pad-max,pack-bfd", "-p", "d_model=64", "--json", out])
    if os.path.exists(out):
        doc = load(out)
        real = {p["params"]["strategy"]: p["info"]["real_tokens"] for p in doc["points"]}
        check(real.get("pad-max") == 100 * 300 + 400 * 100 + 1500 * 20, f"histogram tokens {real}")
    bad = os.path.join(tmp, "bad.txt")
    with open(bad, "w") as f:
        f.write("12\n13\nthirteen\n")
    p = subprocess.run([EXE, "run", "packing", "-p", f"lengths=@{bad}"], capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and "line 3" in p.stderr, f"bad lengths file: exit {p.returncode}: {p.stderr[-300:]}")

if failures:
    print("\n".join("FAIL: " + f for f in failures))
    sys.exit(1)
print("ok")
