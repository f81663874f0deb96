#!/usr/bin/env python3
"""End-to-end: `stallbench run numerics` (the default sweep: every case, fault and fix) on
cpu; the result JSON against the schema and against what each case must show.

usage: test_numerics.py STALLBENCH SCHEMA
"""
import json
import os
import subprocess
import sys
import tempfile

import schema_check

from e2e import check, finish


def main():
    exe, schema_path = sys.argv[1], sys.argv[2]
    with open(schema_path) as f:
        schema = json.load(f)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "n.json")
        p = subprocess.run([exe, "run", "numerics", "--device", "cpu", "--json", out], capture_output=True,
                           text=True, timeout=600)
        print(p.stdout[-6000:])
        check(p.returncode == 0, f"exit {p.returncode}: {p.stderr[-800:]}")
        with open(out) as f:
            doc = json.load(f)
    errs = schema_check.errors(doc, schema)
    check(not errs, f"schema: {errs[:3]}")
    pts = {(q["params"]["case"], q["params"]["fix"]): q for q in doc["points"]}
    check(len(pts) == 16, f"{len(pts)} points, want 16 (8 cases x fix off/on)")
    for k, q in pts.items():
        check(q["status"] == "ok", f"{k}: status {q['status']} {q.get('reason')}")

    def info(case, fix):
        return pts[(case, fix)]["info"]

    def metric(case, fix, m):
        x = pts[(case, fix)]["metrics"].get(m)
        return None if x is None else x["value"]

    # NaN in layer 2's output at step 50; inf in layer 3's gradient at step 50: located exactly
    for case, layer, where, nan_step in (("nan", 2, "activation", 50), ("inf", 3, "gradient", 51)):
        off = info(case, "off")
        check(off.get("first_nonfinite") == {"step": 50, "layer": layer, "tensor": where},
              f"{case}: located {off.get('first_nonfinite')}")
        check(off["outcome"] == "nan" and off.get("loss_nan_step") == nan_step,
              f"{case}: outcome {off['outcome']} loss NaN at {off.get('loss_nan_step')}")
        check(off.get("grad_check_step") == 50 and off.get("epoch_check_step") == 99,
              f"{case}: per-step check {off.get('grad_check_step')}, epoch check {off.get('epoch_check_step')}")
        check(metric(case, "off", "epoch_check_wasted") == 49, f"{case}: wasted {metric(case, 'off', 'epoch_check_wasted')}")
        on = info(case, "on")
        check(on["outcome"] == "target" and metric(case, "on", "skipped_steps") == 1,
              f"{case} fixed: {on['outcome_text']}, skipped {metric(case, 'on', 'skipped_steps')}")
    # fp16 without scaling does not reach the target; with dynamic scaling it does; bf16 needs none
    check(info("fp16", "off")["outcome"] != "target", f"fp16 unscaled: {info('fp16', 'off')['outcome_text']}")
    check(info("fp16", "on")["outcome"] == "target", f"fp16 scaled: {info('fp16', 'on')['outcome_text']}")
    check(metric("fp16", "off", "dw_zero_max") > 2 * metric("fp16", "on", "dw_zero_max"),
          "fp16 unscaled should zero far more dW values than scaled")
    check(info("bf16", "off")["outcome"] == "target", f"bf16 unscaled: {info('bf16', 'off')['outcome_text']}")
    # exploding: diverges without clipping, not with it
    check(info("explode", "off")["outcome"] == "diverged", f"explode: {info('explode', 'off')['outcome_text']}")
    check(info("explode", "on")["outcome"] != "diverged" and metric("explode", "on", "final_loss") < 1.0,
          f"explode clipped: {info('explode', 'on')['outcome_text']}")
    # vanishing: the first layer's gradient is orders of magnitude below the last's; the fix closes the gap
    r_off, r_on = metric("vanish", "off", "grad_ratio_first_last"), metric("vanish", "on", "grad_ratio_first_last")
    check(r_off is not None and r_off < 1e-4, f"vanish: ratio {r_off}")
    check(r_on is not None and r_on > 100 * r_off, f"vanish fixed: ratio {r_on}")
    check(metric("vanish", "on", "final_loss") < 0.5 * metric("vanish", "off", "final_loss"), "vanish fix: loss")
    # lr too low: the plateau detector fires, with an estimate far beyond the fixed run's steps
    check(info("lr-low", "off")["outcome"] == "stalled", f"lr-low: {info('lr-low', 'off')['outcome_text']}")
    est = metric("lr-low", "off", "est_steps_to_target")
    check(est is not None and est > 10 * metric("lr-low", "on", "steps_to_target"),
          f"lr-low estimate {est}")
    # patience: steps after the best eval loss = patience x eval interval
    check(metric("patience", "off", "steps_after_best") == 500, f"patience 50: {metric('patience', 'off', 'steps_after_best')}")
    check(metric("patience", "on", "steps_after_best") == 50, f"patience 5: {metric('patience', 'on', 'steps_after_best')}")
    cases = {f["evidence"].get("case") for f in doc["findings"]}
    check(cases == {"nan", "inf", "fp16", "bf16", "explode", "vanish", "lr-low", "patience"}, f"findings {cases}")
    finish()


if __name__ == "__main__":
    main()
