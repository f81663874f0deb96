#!/usr/bin/env python3
"""End-to-end: `stallbench run precision --quick` on a device, then check the
result JSON against the schema and against what the run must contain.

usage: test_precision_e2e.py STALLBENCH SCHEMA --device cpu|cuda:0
Exit 77 (meson SKIP) when the device does not exist here.
"""
import json
import os
import subprocess
import sys
import tempfile

import schema_check  # jsonschema where installed, else the strict built-in validator


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def main():
    exe, schema_path = sys.argv[1], sys.argv[2]
    device = sys.argv[sys.argv.index("--device") + 1]
    if device.startswith("cuda"):
        fp = json.loads(subprocess.run([exe, "devices", "--json"], capture_output=True, text=True,
                                       timeout=120, check=True).stdout)
        if not fp["gpus"]:
            why = fp["versions"].get("cuda", {}).get("unavailable", "built without CUDA")
            print(f"SKIP: no CUDA device ({why})")
            sys.exit(77)

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        p = subprocess.run([exe, "run", "precision", "--device", device, "--quick", "--json", out],
                           capture_output=True, text=True, timeout=500)
        print(p.stdout)
        print(p.stderr, file=sys.stderr)
        if p.returncode != 0:
            fail(f"exit {p.returncode}")
        if "findings:" not in p.stdout or "tflops" not in p.stdout or "TFLOP/s ↑" not in p.stdout:
            fail("the table lacks its metric header or findings")
        leftovers = [f for f in os.listdir(tmp) if f != "r.json"]
        if leftovers:
            fail(f"temporary files left beside the result: {leftovers}")
        with open(out) as f:
            doc = json.load(f)

    with open(schema_path) as f:
        schema = json.load(f)
    errors = schema_check.errors(doc, schema)
    print(f"schema: validated with {schema_check.validator_name()}")
    if errors:
        fail("schema: " + "; ".join(errors[:5]))

    meta = doc["meta"]
    if meta["device"]["id"] != device:
        fail(f"meta.device.id is {meta['device']['id']}")
    if meta["device"]["simulated"]:
        fail("a real device is labelled simulated")
    if not meta["git_sha"] or "--quick" not in meta["argv"]:
        fail("meta lacks git sha or argv")
    pts = {(p["params"]["size"], p["params"]["dtype"]): p for p in doc["points"]}
    if set(doc["params"]["size"]) != {256, 512}:
        fail(f"--quick sizes are {doc['params']['size']}")
    # oneDNN 2.6 runs bf16 from avx512_core up: below that (an AVX2-only CPU) bf16 is skipped
    # with its reason, and the fp32 -> bf16 figures cannot exist.
    bf16_here = not (device == "cpu" and "avx512f" not in meta["cpu"]["isa"]
                     and pts[(256, "bf16")]["status"] == "skipped")
    if not bf16_here:
        for size in (256, 512):
            if "bf16" not in pts[(size, "bf16")].get("reason", ""):
                fail(f"bf16 skipped at {size} without a reason naming it: {pts[(size, 'bf16')].get('reason')}")
        print("note: no bf16 matmul in oneDNN on this CPU (no AVX-512): bf16 checks skipped")
    for size in (256, 512):
        for dt in ("fp32", "bf16") if bf16_here else ("fp32",):
            p = pts[(size, dt)]
            if p["status"] != "ok":
                fail(f"{size} {dt}: {p['status']} {p.get('reason')}")
            m = p["metrics"]
            if not (m["tflops"]["value"] > 0 and m["tflops"]["unit"] == "TFLOP/s"
                    and m["tflops"]["direction"] == "higher"):
                fail(f"{size} {dt}: bad tflops {m['tflops']}")
            if m["ms"]["direction"] != "lower" or m["ms"]["stats"]["n"] < 3:
                fail(f"{size} {dt}: ms metric lacks stats")
            flops = 2.0 * size ** 3
            if abs(flops / (m["ms"]["value"] * 1e-3) / 1e12 - m["tflops"]["value"]) > 1e-6 * m["tflops"]["value"]:
                fail(f"{size} {dt}: tflops does not equal 2*M*N*K / median time")
            if not p["info"]["impl"]:
                fail(f"{size} {dt}: no implementation recorded")
            if p["info"]["check"]["worst_error_over_tolerance"] >= 1:
                fail(f"{size} {dt}: passed with error over tolerance")
        if not bf16_here:
            continue
        bf = pts[(size, "bf16")]["metrics"]
        ratio = pts[(size, "bf16")]["metrics"]["tflops"]["value"] / pts[(size, "fp32")]["metrics"]["tflops"]["value"]
        if abs(bf["speedup_vs_fp32"]["value"] - ratio) > 1e-9 * ratio:
            fail("speedup_vs_fp32 is not the same-run ratio")
    if device == "cpu":
        isa = meta["cpu"]["isa"]
        impl = pts[(512, "bf16")].get("info", {}).get("impl", "")
        if "amx_bf16" in isa and "amx" not in impl:
            fail(f"CPU has AMX but bf16 ran as {impl}")
        for dt in ("tf32", "fp8_e4m3"):
            p = pts[(256, dt)]
            if p["status"] != "skipped" or not p.get("reason"):
                fail(f"{dt} on cpu should be skipped with a reason")
    if bf16_here and not any(f["summary"].startswith("fp32 -> bf16:") for f in doc["findings"]):
        fail("no fp32 -> bf16 finding")
    if device == "cpu":
        check_fp8_shapes(exe)
    print("ok:", len(doc["points"]), "points,", len(doc["findings"]), "findings")


def check_fp8_shapes(exe):
    """On sim:h100 (which refuses what cuBLASLt refuses), fp8 runs at legal sizes, its pre-timing
    check included, and an illegal size is skipped with the rule named, not timed or failed."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "fp8.json")
        p = subprocess.run([exe, "run", "precision", "--device", "sim:h100", "--quick", "-p", "size=256,100",
                            "-p", "dtype=fp8_e4m3,bf16", "--json", out], capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            fail(f"sim:h100 fp8 run: exit {p.returncode}: {p.stderr[-600:]}")
        with open(out) as f:
            pts = {(q["params"]["size"], q["params"]["dtype"]): q for q in json.load(f)["points"]}
    # pct_of_peak against the expected file's datasheet peak, exactly.
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "..", "results", "expected", "h100-sxm.json")) as f:
        peaks = json.load(f)["peaks"]["tflops"]
    for dt in ("fp8_e4m3", "bf16"):
        q = pts[(256, dt)]
        if q["status"] != "ok":
            fail(f"sim:h100 {dt} at 256: {q['status']} {q.get('reason')}")
            continue
        want = 100 * q["metrics"]["tflops"]["value"] / peaks[dt]["value"]
        got = q["metrics"].get("pct_of_peak", {}).get("value")
        if got is None or abs(got - want) > 1e-9 * want:
            fail(f"sim:h100 {dt}: pct_of_peak {got} != 100 * tflops / {peaks[dt]['value']} = {want}")
    bad = pts[(100, "fp8_e4m3")]
    if bad["status"] != "skipped" or "multiples of 16" not in bad.get("reason", ""):
        fail(f"fp8 at 100x100x100 should be skipped naming the rule: {bad['status']} {bad.get('reason')}")
    if pts[(100, "bf16")]["status"] != "ok":
        fail("bf16 at 100 has no alignment rule and must run")


if __name__ == "__main__":
    main()
