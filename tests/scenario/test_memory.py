#!/usr/bin/env python3
"""End-to-end: `stallbench run memory` on cpu with a memory limit (the default sweep, checkpointing none
and full), on sim:h100, and with bad input; the result JSON against the schema and what the cause must show:
the footprint model agrees with the allocator part by part, the predicted largest micro batch runs every time
and the next size fails as an OOM every time, checkpointing fits more, an OOM is recovered from, and a caching
allocator fails on fragmentation while the total would fit.

usage: test_memory.py STALLBENCH SCHEMA
"""
import json
import sys
import tempfile

from e2e import check, finish, m, run_scenario

def run(exe, schema, tmp, name, args, want_rc=0):
    p, doc = run_scenario(exe, schema, tmp, "memory", name, args, want_rc=want_rc)
    return p if want_rc != 0 else doc


def main():
    exe, schema_path = sys.argv[1], sys.argv[2]
    with open(schema_path) as f:
        schema = json.load(f)
    with tempfile.TemporaryDirectory() as tmp:
        doc = run(exe, schema, tmp, "cpu", ["--device", "cpu", "-p", "frag_steps=60"])
        pts = {q["params"]["checkpointing"]: q for q in doc["points"]}
        check(set(pts) == {"none", "full"}, f"points {list(pts)}")
        for k, q in pts.items():
            info = q["info"]
            check(info["limit_from"] == "mem_limit_gb" and info["limit_bytes"] == 40_000_000, f"{k}: limit {info}")
            # the model beside the allocator, part by part (the bound: 5%)
            parts = info["parts_at_micro_batch"]
            check(len(parts) == 8, f"{k}: parts {list(parts)}")
            for name, v in parts.items():
                check(v["error_pct"] <= 5, f"{k}: {name} model {v['model_bytes']} vs measured {v['measured_bytes']}")
            for name in ("weights", "gradients", "optimizer", "activations", "attention", "backward"):
                check(parts[name]["measured_bytes"] > 0, f"{k}: {name} measured 0")
            check(abs(m(q, "footprint_mib") - m(q, "model_footprint_mib")) <= 0.05 * m(q, "footprint_mib"),
                  f"{k}: footprint {m(q, 'footprint_mib')} vs model {m(q, 'model_footprint_mib')}")
            # the predicted largest runs every time; the next size fails as oom every time
            v = info["verify"]
            check(v["runs"] == 3 and v["ok_at_predicted"] == 3 and v["oom_at_next"] == 3, f"{k}: verify {v}")
            check("out of memory" in v["next_error"] and "needs" in v["next_error"], f"{k}: {v['next_error']}")
            largest = m(q, "largest_micro_batch")
            check(largest >= 2, f"{k}: largest {largest}")
            check(largest == m(q, "predicted_largest_micro_batch"),
                  f"{k}: measured {largest} vs predicted {m(q, 'predicted_largest_micro_batch')}")
            # the bisection's trail: the largest fits, the next size does not
            trail = {t["micro_batch"]: t["fits"] for t in info["bisection"]}
            check(trail.get(int(largest)) is True and trail.get(int(largest) + 1) is False, f"{k}: trail {trail}")
            # the OOM loop: the model resident (exactly its parameters, gradients and AdamW state, nothing a
            # micro batch sizes), twice the largest fails once, and the halving lands on the largest itself
            o = info["oom_loop"]
            resident = sum(parts[n]["measured_bytes"] for n in ("weights", "gradients", "optimizer"))
            check(o["resident_bytes"] == resident, f"{k}: resident {o['resident_bytes']} vs the parts' {resident}")
            check(o["started_at"] == 2 * largest and o["failed_attempts"] == 1 and o["ran_at"] == largest,
                  f"{k}: oom loop {o}")
            check("out of memory" in o["first_error"], f"{k}: {o['first_error']}")
            tries = o["attempts"]
            check([t["micro_batch"] for t in tries] == [2 * largest, largest] and [t["ok"] for t in tries] == [False, True],
                  f"{k}: attempts {tries}")
            # the cost runs from the failing allocation to the retried step done: it holds the failure's
            # unwinding and the retry, and none of the failed attempt's time before its allocation failed
            f0 = tries[0]
            check(f0["to_failure_ms"] >= 0 and f0["unwind_ms"] >= 0, f"{k}: failed attempt {f0}")
            check(m(q, "oom_cost_ms") >= o["retried_step_ms"] + f0["unwind_ms"] - 1e-6, f"{k}: cost {m(q, 'oom_cost_ms')}")
            check(abs(m(q, "oom_lost_ms") - f0["ms"]) < 1e-6, f"{k}: lost {m(q, 'oom_lost_ms')} vs {f0}")
            check(o["model_build_ms"] > 0 and m(q, "tokens_per_s") > 0, f"{k}: build {o['model_build_ms']}")
        check(m(pts["full"], "largest_micro_batch") > m(pts["none"], "largest_micro_batch"),
              "checkpointing does not fit a larger batch")
        pn, pf = pts["none"]["info"]["parts_at_micro_batch"], pts["full"]["info"]["parts_at_micro_batch"]
        check(pf["activations"]["measured_bytes"] < pn["activations"]["measured_bytes"], "checkpointing kept as much")
        check(pf["weights"] == pn["weights"], "checkpointing changed the weights")
        # fragmentation: the pool needs more than the peak; just below it, it fails while the total fits
        fr = pts["none"]["info"]["fragmentation"]
        check(fr["capacity_needed_bytes"] >= fr["peak_need_bytes"], f"fragmentation {fr['capacity_needed_bytes']}")
        series = fr["at_needed"]["series"]
        check(len(series) == 60 and len({s["padded_len"] for s in series}) > 5, f"series {len(series)}")
        if fr["capacity_needed_bytes"] > fr["peak_need_bytes"] + (1 << 20):
            jb = fr.get("just_below")
            if check(jb is not None, "no failure just below the capacity the pool needs"):
                check(jb["capacity"] >= fr["peak_need_bytes"], f"just below {jb}")
                # fragmentation exactly when the free bytes held in the request's own pool would take it
                # (a large request cannot use the small pool's blocks): never more than all the free bytes
                check(jb["reserved_unallocated_in_its_pool"] <= jb["reserved_unallocated"], f"pool free {jb}")
                frag = jb["reserved_unallocated_in_its_pool"] >= jb["failed_request"]
                check(jb["kind"] == ("fragmentation" if frag else "segment granularity"), f"kind {jb}")
                check(jb["reserved"] <= jb["capacity"] and jb["allocated"] <= jb["reserved"], f"accounts {jb}")
        check(any(f["summary"].startswith("caching allocator:") for f in doc["findings"]), "no allocator finding")
        check(any("gradient_checkpointing fits micro batch" in f["summary"] for f in doc["findings"]),
              "no checkpointing finding")
        check(sum("-> micro_batch_size:" in f["summary"] for f in doc["findings"]) == 2, "config lines")

        s = run(exe, schema, tmp, "sim", ["--device", "sim:h100", "--quick"])
        check(s["meta"]["device"]["simulated"], "sim result not labelled simulated")
        check(all("simulated" in f["summary"] for f in s["findings"]), "sim findings not labelled")

        for bad, text in ((["-p", "mem_limit_gb=0"], "no capacity of its own"),
                          (["-p", "d_model=30", "-p", "heads=4"], "not a multiple"),
                          (["-p", "lengths=lognormal:x"], "lognormal"),
                          (["-p", "mem_limit_gb=1e-9"], "under 1 MiB")):
            p = run(exe, schema, tmp, "bad", ["--device", "cpu"] + bad, want_rc=2)
            check(text in p.stderr, f"{bad}: {p.stderr[-300:]}")
    finish()


if __name__ == "__main__":
    main()
