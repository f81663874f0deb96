#!/usr/bin/env python3
"""diagnose --trace on every real trace the project did not write: the first finding is the cause the
data's own README reads from the trace (../shared/traces/README.md, ../shared/traces-more/README.md: "cause
and evidence", written from a separate reading of each file), with the host attribution (a GPU trace) or
the CPU ops' breakdown (a CPU-only trace) as its evidence; the figures HTA computes agree with HTA 0.5.0's
(traces-more/hta_reference.json) to 1 point where HTA reads the file, and a file HTA fails on is still
read. The data is third-party: read from $STALLBENCH_SHARED_DATA (default ../shared); absent, SKIP.

usage: test_trace_real.py STALLBENCH SCHEMA SHARED_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import schema_check  # noqa: E402
import shared_data  # noqa: E402

# file -> (the first finding's cause, as the README names it; what its evidence must mention)
EXPECTED = {
    "traces/amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz": ("a batch too small (launch-bound)", "launch"),
    "traces/cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz": ("no GPU events: CPU-only", ""),
    "traces/nccl_parser_config__nccl_data.json.gz": ("a batch too small (launch-bound)", ""),
    "traces/ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz": ("fp32 where bf16 would do", ""),
    "traces/timeline_analysis__sampled_rank-0.json.gz": ("waiting on collectives", ""),
    "traces-more/pytorch__kineto__resnet50_v100_nw0.pt.trace.json.gz": ("a slow host dataloader", "DataLoader"),
    "traces-more/pytorch__kineto__resnet50_autograd_nw0.pt.trace.json.gz":
        ("warm-up in the profiled window (not steady state)", ""),
    "traces-more/AMD-AGI__TraceLens__mi300x_resnet_ddp_ckpt_rank0.pt.trace.json.gz": ("waiting on collectives", ""),
    "traces-more/AMD-AGI__TraceLens__h100_bert_small_infer.pt.trace.json.gz": ("a batch too small (launch-bound)", ""),
    "traces-more/AMD-AGI__TraceLens__h100_qwen05b_infer.pt.trace.json.gz": ("none found", ""),
    "traces-more/AMD-AGI__TraceLens__mi210_resnet_bf16_gpu_only.pt.trace.json.gz": ("none found", ""),
    # its README: one slow op, the eager bf16 softmax of unfused attention (SDPA/flash would remove it)
    "traces-more/AMD-AGI__TraceLens__h100_timesformer_infer.pt.trace.json.gz":
        ("attention without a fused kernel", "softmax"),
    "traces-more/AMD-AGI__TraceLens__b200_vllm_eager_rank0.pt.trace.json.gz": ("a batch too small (launch-bound)", ""),
}
# the second cause where the README names one that a rule covers
SECOND = {"traces/cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz": "waiting on collectives",
          "traces-more/pytorch__kineto__resnet50_v100_nw0.pt.trace.json.gz": "fp32 where bf16 would do"}
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
    return cond


def main():
    exe, schema, shared = sys.argv[1:4]
    root = os.environ.get("STALLBENCH_SHARED_DATA") or shared
    why = shared_data.missing([os.path.join(root, "traces"), os.path.join(root, "traces-more")])
    if why:
        print(f"SKIP: {why}")
        return shared_data.SKIP
    with open(schema) as f:
        schema_doc = json.load(f)
    with open(os.path.join(root, "traces-more", "hta_reference.json")) as f:
        hta = json.load(f)
    right = 0
    with tempfile.TemporaryDirectory() as tmp:
        for rel, (cause, mention) in EXPECTED.items():
            path = os.path.join(root, rel)
            if not check(os.path.exists(path), f"{rel}: absent"):
                continue
            out = os.path.join(tmp, "r.json")
            p = subprocess.run([exe, "diagnose", "--trace", path, "--device", "cpu", "--json", out],
                               capture_output=True, text=True, timeout=300)
            if not check(p.returncode == 0, f"{rel}: exit {p.returncode}: {p.stderr[-300:]}"):
                continue
            with open(out) as f:
                doc = json.load(f)
            errs = schema_check.errors(doc, schema_doc)
            check(not errs, f"{rel}: schema: {errs[:3]}")
            causes = [x["cause"] for x in doc["findings"]]
            first = doc["findings"][0]
            ok = check(causes[0] == cause, f"{rel}: first finding {causes[0]!r}, its README reads {cause!r} ({causes})")
            right += ok
            ev = first.get("evidence", {})
            if cause != "none found":
                gpu = bool(doc["meta"]["trace_analysis"]["temporal"])
                # the evidence under the finding: what the host did while the GPU waited, or the CPU ops' breakdown
                check(("host_attribution" in ev) if gpu else ("cpu_breakdown" in ev),
                      f"{rel}: the first finding carries no {'host attribution' if gpu else 'CPU breakdown'}: "
                      f"{list(ev)}")
                text = json.dumps(ev) + first["summary"]
                check(mention.lower() in text.lower(), f"{rel}: the evidence does not mention {mention!r}")
            if rel in SECOND:
                check(len(causes) > 1 and causes[1] == SECOND[rel], f"{rel}: second finding {causes[1:2]}")
            # HTA 0.5.0's temporal breakdown, where HTA reads the file (traces/ has its own peer test)
            ref = hta.get(os.path.basename(rel), {}) if rel.startswith("traces-more/") else {}
            tb = ref.get("temporal") if isinstance(ref, dict) else None
            if tb:
                ours = doc["meta"]["trace_analysis"]["temporal"]
                if check(len(ours) >= 1, f"{rel}: no device broken down where HTA has {len(tb)}"):
                    t0, o0 = tb[0], ours[0]
                    for k, h in (("idle_pct", "idle_time_pctg"), ("compute_pct", "compute_time_pctg"),
                                 ("non_compute_pct", "non_compute_time_pctg")):
                        check(abs(o0[k] - t0[h]) <= 1.0, f"{rel}: {k} {o0[k]:.2f} vs HTA {t0[h]}")
            print(f"  {'ok ' if ok else 'NO '} {rel}: {causes[:3]}")
    print(f"first finding as the README reads it: {right} of {len(EXPECTED)}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
