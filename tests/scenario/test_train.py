#!/usr/bin/env python3
"""End-to-end: `stallbench run train` on cpu and sim:h100: the three collations over one dataset, an
inline loader against workers, bad input. What is asserted is arithmetic the loop must keep (the
same rows padded two ways carry the same real tokens; packing pads least) and what the loader's
placement must show (inline, a costly loader is waited for; with workers, less), never a speed.

usage: test_train.py STALLBENCH SCHEMA
"""
import json
import os
import sys
import tempfile

from e2e import check, finish, m, run_scenario

def run(exe, schema, tmp, name, args, want_rc=0):
    return run_scenario(exe, schema, tmp, "train", name, args, want_rc=want_rc)


def main():
    exe, schema_path = sys.argv[1], sys.argv[2]
    with open(schema_path) as f:
        schema = json.load(f)
    with tempfile.TemporaryDirectory() as tmp:
        base = ["--device", "cpu", "-p", "seq_len=128", "-p", "d_model=32", "-p", "heads=2", "-p", "micro_batch=4",
                "-p", "lengths=lognormal:32,1.0", "-p", "sequences=512", "-p", "trials=4", "-p", "load_us_per_token=0"]
        _, doc = run(exe, schema, tmp, "collate", base + ["-p", "collate=pad-max,pad-longest,pack"])
        if doc:
            by = {q["params"]["collate"]: q for q in doc["points"]}
            pm, pl, pk = by["pad-max"], by["pad-longest"], by["pack"]
            # the same rows, padded two ways: the same real tokens per batch
            rpb = lambda q: q["info"]["real_tokens"] / q["info"]["batches"]
            check(abs(rpb(pm) - rpb(pl)) < 1e-9, f"real tokens per batch differ: {rpb(pm)} vs {rpb(pl)}")
            check(pm["info"]["padded_lengths"] == [128], f"pad-max lengths {pm['info']['padded_lengths']}")
            check(all(x % 64 == 0 or x == 128 for x in pl["info"]["padded_lengths"]),
                  f"pad-longest lengths not multiples of pad_multiple: {pl['info']['padded_lengths']}")
            check(m(pm, "padding_pct") > m(pl, "padding_pct") > m(pk, "padding_pct"),
                  f"padding {m(pm, 'padding_pct')} {m(pl, 'padding_pct')} {m(pk, 'padding_pct')}")
            check(rpb(pk) > 2 * rpb(pm), f"packed rows carry {rpb(pk)} real tokens a batch, padded {rpb(pm)}")
            # one finding per swept value against the first
            axes = [f["evidence"]["axis"] for f in doc["findings"]]
            check(axes.count("collate") == 2, f"findings {axes}")
            for q in doc["points"]:
                check(0 < m(q, "busy_pct") <= 100.5 and m(q, "real_tokens_per_s") > 0, f"figures {q['metrics']}")

        # a costly loader: inline it runs in series with the step and is waited for; two workers load
        # beside it (on 2 cores they share the CPU the compute leaves: less wait, not none)
        _, doc = run(exe, schema, tmp, "loader", base[:-2] + ["-p", "collate=pack", "-p", "workers=0,2",
                                                              "-p", "load_us_per_token=60"])
        if doc:
            by = {q["params"]["workers"]: q for q in doc["points"]}
            w0, w2 = by[0], by[2]
            check(m(w0, "data_wait_pct") > 10, f"inline: data wait {m(w0, 'data_wait_pct')}%")
            check(m(w2, "data_wait_pct") < m(w0, "data_wait_pct"),
                  f"workers: data wait {m(w2, 'data_wait_pct')}% >= inline {m(w0, 'data_wait_pct')}%")
            check(m(w0, "load_ms_per_batch") > 0.5 * 60e-3 * w0["info"]["real_tokens"] / w0["info"]["batches"],
                  f"the loader's CPU time per batch {m(w0, 'load_ms_per_batch')} ms is under half its assumed work")
            check("loader" in w0["info"]["bottleneck"], f"inline bottleneck {w0['info']['bottleneck']}")
            # whatever the warm-up (workers + 1 steps), the timed steps train the same batches
            check(w0["info"]["real_tokens"] == w2["info"]["real_tokens"] and
                  w0["info"]["computed_tokens"] == w2["info"]["computed_tokens"],
                  f"timed batches differ: {w0['info']['real_tokens']} vs {w2['info']['real_tokens']} real tokens")
            # real tokens/s: the computed rate at the epoch's real share, the timed batches' own kept beside it
            for q in (w0, w2):
                share = 1 - m(q, "padding_pct") / 100
                check(abs(m(q, "real_tokens_per_s") - m(q, "tokens_per_s") * share) <= 1e-6 * m(q, "tokens_per_s"),
                      f"real tokens/s {m(q, 'real_tokens_per_s')} is not tokens/s x the epoch's share {share}")
                check("timed_real_tokens_per_s" in q["metrics"], "no timed_real_tokens_per_s")

        # min_time_s: past `trials` steps until the timed steps span that long
        _, doc = run(exe, schema, tmp, "min-time", base[:-4] + ["-p", "trials=2", "-p", "min_time_s=0.5"])
        if doc:
            q = doc["points"][0]
            span = m(q, "step_ms") * q["info"]["steps"] / 1e3
            check(q["info"]["steps"] > 2 and span >= 0.5,
                  f"min_time_s=0.5: {q['info']['steps']} steps spanning {span:.3f} s")

        # sim:h100: the loop on a modelled device, labelled so
        _, doc = run(exe, schema, tmp, "sim", ["--device", "sim:h100", "--quick"])
        if doc:
            check(doc["meta"]["device"]["simulated"], "sim not labelled simulated")

        # bad input: exit 2 before anything runs, naming the parameter
        p, _ = run(exe, schema, tmp, "bad-seq", ["--device", "cpu", "-p", "sequences=4", "-p", "micro_batch=64"],
                   want_rc=2)
        check("micro batch" in p.stderr, f"sequences/micro_batch: {p.stderr[-300:]}")
        p, _ = run(exe, schema, tmp, "bad-collate", base + ["-p", "collate=zip"], want_rc=2)
        check("collate" in p.stderr, f"collate: {p.stderr[-300:]}")
        p, _ = run(exe, schema, tmp, "bad-lengths", base + ["-p", "lengths=@" + os.path.join(tmp, "none.txt")],
                   want_rc=2)
        check("lengths" in p.stderr, f"lengths: {p.stderr[-300:]}")
    finish()


if __name__ == "__main__":
    main()
