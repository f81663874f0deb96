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


def close(a, b, rel=1e-9):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-300)


def recheck_attention(doc):
    """Every derived figure of every ok point, recomputed from the point's own data (DESIGN's
    convention: forward 4*B*H*S^2*D, halved for causal, forward+backward 3.5x forward)."""
    naive = {}
    for pt in doc["points"]:
        if pt["status"] != "ok":
            continue
        q, m = pt["params"], pt["metrics"]
        flops = 4.0 * q["batch"] * q["heads"] * q["seq_len"] ** 2 * q["head_dim"]
        flops *= 0.5 if q["causal"] else 1.0
        flops *= 3.5 if q["pass"] == "fwd+bwd" else 1.0
        tag = f"attention {q['impl']} S={q['seq_len']} {q['pass']} causal={q['causal']}"
        check(close(pt["info"]["flops"], flops), f"{tag}: flops {pt['info']['flops']} != {flops}")
        check(close(m["tflops"]["value"], flops / (m["ms"]["value"] * 1e-3) / 1e12),
              f"{tag}: tflops is not flops / median time")
        if q["impl"] == "naive":
            naive[tuple((k, v) for k, v in q.items() if k != "impl")] = m
    for pt in doc["points"]:
        q, m = pt["params"], pt.get("metrics", {})
        key = tuple((k, v) for k, v in q.items() if k != "impl")
        if pt["status"] != "ok" or q["impl"] == "naive" or key not in naive:
            continue
        n = naive[key]
        check(close(m["speedup_vs_naive"]["value"], n["ms"]["value"] / m["ms"]["value"]),
              f"{q}: speedup_vs_naive is not naive ms / this ms")
        check(close(m["memory_ratio_vs_naive"]["value"], n["peak_mib"]["value"] / m["peak_mib"]["value"]),
              f"{q}: memory_ratio_vs_naive is not naive peak memory / this peak memory")


def recheck_packing(doc):
    """padding, efficiency, throughput and the ratios over pad-max, from each point's own data."""
    def workload(pt):  # every parameter but the strategy: a point's pad-max is its own workload's
        return json.dumps({k: v for k, v in pt["params"].items() if k != "strategy"}, sort_keys=True)
    bases = {workload(pt): pt for pt in doc["points"] if pt["status"] == "ok" and pt["params"]["strategy"] == "pad-max"}
    for pt in doc["points"]:
        if pt["status"] != "ok":
            continue
        base = bases.get(workload(pt))
        q, m, i = pt["params"], pt["metrics"], pt["info"]
        tag = f"packing {q['strategy']}"
        check(close(m["padding_pct"]["value"], 100 * (1 - i["real_tokens"] / i["computed_tokens"])),
              f"{tag}: padding_pct != 1 - real / computed")
        check(close(m["efficiency_pct"]["value"], 100 * i["real_tokens"] / (m["rows"]["value"] * q["max_len"])),
              f"{tag}: efficiency_pct != real / (rows * max_len)")
        # The epoch's real tokens over its time: its GEMM FLOPs at the timed GEMMs' FLOP/s, plus its
        # attention FLOPs at the timed attention's.
        gs, at = m["gemm_ms"]["value"] * 1e-3, m["attention_ms"]["value"] * 1e-3
        check(close(m["ms"]["value"], 1e3 * (gs + at)), f"{tag}: ms != the GEMMs' median + the attention's")
        tg, eg = i["timed_gemm_flops"], i["epoch_gemm_flops"]
        ta, ea = i["timed_flops"] - tg, i["epoch_flops"] - eg
        check(tg > 0 and ta > 0 and eg >= tg and ea >= ta * (1 - 1e-12), f"{tag}: FLOP counts {tg} {ta} {eg} {ea}")
        check(close(m["gemm_tflops"]["value"], tg / gs / 1e12), f"{tag}: gemm_tflops")
        check(close(m["attention_tflops"]["value"], ta / at / 1e12), f"{tag}: attention_tflops")
        epoch_s = gs * eg / tg + at * ea / ta
        check(close(m["real_tokens_per_s"]["value"], i["real_tokens"] / epoch_s),
              f"{tag}: real_tokens_per_s != the epoch's real tokens / (GEMM and attention FLOPs at their timed FLOP/s)")
        check(close(m["timed_real_tokens_per_s"]["value"], i["timed_real_tokens"] / (m["ms"]["value"] * 1e-3)),
              f"{tag}: timed_real_tokens_per_s != timed real tokens / median time")
        if i["timed_batches"] == i["batches"]:  # the whole epoch timed: the two FLOP counts are one
            check(close(i["epoch_flops"], i["timed_flops"]) and close(i["epoch_gemm_flops"], i["timed_gemm_flops"]),
                  f"{tag}: epoch FLOPs {i['epoch_flops']} ({i['epoch_gemm_flops']} GEMM) != timed "
                  f"{i['timed_flops']} ({i['timed_gemm_flops']}) with every batch timed")
        if base is None or pt is base:
            continue
        bm, bi = base["metrics"], base["info"]
        check(close(m["speedup_vs_pad_max"]["value"], m["real_tokens_per_s"]["value"] / bm["real_tokens_per_s"]["value"]),
              f"{tag}: speedup_vs_pad_max != real tokens/s over pad-max's")
        cpr = lambda x: x["computed_tokens"] / x["real_tokens"]
        check(close(m["predicted_speedup"]["value"], cpr(bi) / cpr(i)), f"{tag}: predicted_speedup")
        fpr = lambda x: x["epoch_flops"] / max(1, x["real_tokens"])
        check(close(m["predicted_flops_speedup"]["value"], fpr(bi) / fpr(i)), f"{tag}: predicted_flops_speedup")


def load(path):
    with open(path) as f:
        doc = json.load(f)
    with open(SCHEMA) as f:
        errs = schema_check.errors(doc, json.load(f))
    check(not errs, f"{path}: schema: " + "; ".join(errs[:3]))
    return doc


with tempfile.TemporaryDirectory() as tmp:
    # Attention: naive vs flash, with a memory cap that naive's S x S cannot fit at 1024 (15 MB: a forward
    # alone needs about 18 MiB there, S and P; 20 MB held it once fwd points stopped holding 4 gradients).
    out = os.path.join(tmp, "att.json")
    run(["attention", "--device", "cpu", "--quick", "-p", "seq_len=128,1024", "-p", "heads=2",
         "-p", "mem_limit_gb=0.015", "--json", out])
    if check(os.path.exists(out), f"{out} was not written"):
        doc = load(out)
        recheck_attention(doc)
        pts = {(p["params"]["seq_len"], p["params"]["impl"], p["params"]["pass"]): p for p in doc["points"]}
        for ps in ("fwd", "fwd+bwd"):
            check(pts[(128, "naive", ps)]["status"] == "ok", f"naive 128 {ps}: {pts[(128, 'naive', ps)]['status']}")
            check(pts[(1024, "naive", ps)]["status"] == "oom", f"naive 1024 {ps} under 15 MB should be oom")
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

    # Causal forward+backward: the 0.5 and 3.5 factors of the FLOP convention, rechecked.
    out = os.path.join(tmp, "causal.json")
    run(["attention", "--device", "cpu", "--quick", "-p", "seq_len=128", "-p", "heads=1", "-p", "impl=naive,flash",
         "-p", "causal=true", "-p", "pass=fwd,fwd+bwd", "--json", out])
    if check(os.path.exists(out), f"{out} was not written"):
        doc = load(out)
        check(len([p for p in doc["points"] if p["status"] == "ok"]) == 4, "causal: four ok points")
        recheck_attention(doc)

    # Packing: the seeds' case (mean 256 tokens, max_len 2048) is ~87% padding under pad-max.
    out = os.path.join(tmp, "pack.json")
    p = run(["packing", "--device", "cpu", "--quick", "-p", "max_len=2048", "-p", "sequences=1024",
             "-p", "d_model=64", "--json", out])
    check("warning: concat lets examples attend to each other" in p.stdout, "concat is flagged in the table")
    if check(os.path.exists(out), f"{out} was not written"):
        doc = load(out)
        recheck_packing(doc)
        pts = {p["params"]["strategy"]: p for p in doc["points"]}
        check(all(p["status"] == "ok" for p in pts.values()), f"statuses {[(k, p['status']) for k, p in pts.items()]}")
        pad = pts["pad-max"]["metrics"]["padding_pct"]["value"]
        check(84 <= pad <= 90, f"pad-max padding {pad:.1f}%, want about 87%")
        for s in ("pack-ffd", "pack-bfd"):
            check(pts[s]["metrics"]["efficiency_pct"]["value"] > 97, f"{s} efficiency")
            check(pts[s]["metrics"]["predicted_speedup"]["value"] > 4, f"{s} predicted speedup")
        check(pts["concat"]["info"]["cross_contamination"] is True, "concat marked as cross-contaminating")
        check(any("pad-max computes" in f["summary"] for f in doc["findings"]), "packing finding")

    # Every batch timed, every strategy (pack-hist's rows by the group): the epoch's FLOPs, counted
    # from the plan alone, equal the timed batches' FLOPs, counted from the shapes prepared.
    out = os.path.join(tmp, "all.json")
    run(["packing", "--device", "cpu", "--quick", "-p", "sequences=48", "-p", "rows=3", "-p", "batches=1000",
         "-p", "d_model=64", "-p", "strategy=pad-max,pad-longest,bucket,pack-ffd,pack-bfd,pack-hist,concat",
         "--json", out])
    if check(os.path.exists(out), f"{out} was not written"):
        doc = load(out)
        check(all(p["status"] == "ok" and p["info"]["timed_batches"] == p["info"]["batches"] for p in doc["points"]),
              "every batch timed, every point ok")
        recheck_packing(doc)

    # A sweep of two length distributions: each strategy against its own distribution's pad-max,
    # one finding per distribution, named (they were held against the last pad-max, and one
    # finding mixed the two).
    out = os.path.join(tmp, "two.json")
    run(["packing", "--device", "cpu", "--quick", "-p", "lengths=lognormal:300,0.8;uniform:16,512", "-p", "max_len=512",
         "-p", "sequences=256", "-p", "d_model=64", "-p", "strategy=pad-max,pack-bfd", "--json", out])
    if check(os.path.exists(out), f"{out} was not written"):
        doc = load(out)
        recheck_packing(doc)
        sums = [f["summary"] for f in doc["findings"]]
        check(len(sums) == 2 and sums[0].startswith("lengths=lognormal:300,0.8: pad-max computes")
              and sums[1].startswith("lengths=uniform:16,512: pad-max computes"), f"two findings, one each: {sums}")

    # A length histogram from a file (CSV length,count).
    hist = os.path.join(tmp, "hist.csv")
    with open(hist, "w") as f:
        f.write("length,count\n100,300\n400,100\n1500,20\n")
    out = os.path.join(tmp, "hist.json")
    run(["packing", "--device", "cpu", "--quick", "-p", f"lengths=@{hist}", "-p", "sequences=0",
         "-p", "strategy=pad-max,pack-bfd", "-p", "d_model=64", "--json", out])
    if check(os.path.exists(out), f"{out} was not written"):
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
