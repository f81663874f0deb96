#!/usr/bin/env python3
"""diagnose --trace on a whole job: every rank's trace read, each rank's figures side by side, the
straggler named.

  - The real 8-rank DLRM job (V100 x8, facebookresearch/param's dlrm_kineto; read from
    $STALLBENCH_SHARED_DATA/traces-more, skipped where absent): each rank's idle / compute /
    non-compute % within 1 point of Holistic Trace Analysis 0.5.0's (hta_reference.json there),
    rank 7 named the straggler (its README: every rank's first all-to-all ends at one instant, rank 7
    arrives last, ranks 2 and 6 late too) as the first finding, the lateness placed before the step.
  - The project's own gloo jobs (tests/data/traces/job, made with real torch by make_job_traces.py):
    a rank that sleeps 40 ms before its all_reduce each step is named; a balanced job names none.
  - Several files given one by one read as their directory does; one job's rank twice, an empty
    directory, a path that is not there: exit 2 with a message.

usage: test_trace_job.py STALLBENCH SCHEMA SHARED_TRACES_MORE OWN_JOB_DIR
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import schema_check  # noqa: E402
import shared_data  # noqa: E402
from test_diagnose import png_pixels  # noqa: E402

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
    return cond


def run(exe, args, out, timeout=120):
    p = subprocess.run([exe, "diagnose", "--trace", *args, "--device", "cpu", "--json", out],
                       capture_output=True, text=True, timeout=timeout)
    doc = None
    if p.returncode == 0:
        with open(out) as f:
            doc = json.load(f)
    return p, doc


def first(doc):
    return doc["findings"][0] if doc and doc["findings"] else {}


def screenshot(html, tmp, name):
    """The report rendered by headless Chromium: a page with content, not a blank one (None without Chromium)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not chromium:
        print("SKIP the screenshot: no chromium (scripts/test installs it)")
        return None
    png = os.path.join(tmp, name + ".png")
    r = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--window-size=1100,900", f"--screenshot={png}", "file://" + html],
                       capture_output=True, text=True, timeout=120, cwd=tmp)
    if not check(os.path.exists(png), f"{name}: no screenshot: {r.stderr[-300:]}"):
        return None
    w, h, values = png_pixels(png)
    check((w, h) == (1100, 900) and len(values) > 64, f"{name}: screenshot {w}x{h}, {len(values)} byte values: blank?")
    return png


def timeline(exe, more, tmp):
    """One real trace's HTML: a row per steady iteration, the loader's waits drawn in its colour."""
    f = os.path.join(more, "pytorch__kineto__resnet50_v100_nw0.pt.trace.json.gz")
    if not os.path.exists(f):
        return
    html = os.path.join(tmp, "resnet.html")
    p = subprocess.run([exe, "diagnose", "--trace", f, "--device", "cpu", "--json", os.path.join(tmp, "resnet.json"),
                        "--html", html], capture_output=True, text=True, timeout=120)
    if not check(p.returncode == 0, f"resnet --html: exit {p.returncode}"):
        return
    with open(os.path.join(tmp, "resnet.json")) as fh:
        doc = json.load(fh)
    tl = doc["meta"]["timeline"]
    check(len(tl) == 6, f"resnet timeline: {len(tl)} iterations, the trace has 6 steps")
    loader = sum(b - a for it in tl for a, b, c in it["idle"] if c == "loader")
    total = sum(it["ms"] for it in tl)
    # its README: __next__ 39.6% of the window, the device waiting on it ~34% of step time
    check(0.2 < loader / total < 0.45, f"resnet timeline: the loader's stretches {loader:.1f} of {total:.1f} ms")
    with open(html, encoding="utf-8") as fh:
        text = fh.read()
    check("The trace came from: <b>Tesla V100-DGXS-32GB</b>" in text, "resnet: the header does not name the trace's GPU")
    check(text.count("aria-label='step ") == 6 and "fill='#c0392b'" in text, "resnet: no per-step timeline with the loader")
    screenshot(html, tmp, "resnet")
    print(f"  resnet timeline: 6 iterations, the loader's waits {loader:.1f} ms of {total:.1f}")


def dlrm(exe, schema_doc, more, tmp):
    job = os.path.join(more, "facebookresearch__param__dlrm_v100x8")
    why = shared_data.missing([job, os.path.join(more, "hta_reference.json")])
    if why:
        print(f"DLRM part skipped: {why}")
        return False
    with open(os.path.join(more, "hta_reference.json")) as f:
        ref = json.load(f)["facebookresearch__param__dlrm_v100x8/"]
    html = os.path.join(tmp, "dlrm.html")
    p, doc = run(exe, [job, "--html", html], os.path.join(tmp, "dlrm.json"))
    if not check(p.returncode == 0, f"dlrm: exit {p.returncode}: {p.stderr[-400:]}"):
        return True
    errs = schema_check.errors(doc, schema_doc)
    check(not errs, f"dlrm: result JSON against the schema: {errs[:3]}")
    ranks = {r["rank"]: r for r in doc["meta"]["job"]["ranks"]}
    check(sorted(ranks) == list(range(8)), f"dlrm: ranks {sorted(ranks)}")
    for t in ref["temporal"]:
        r = ranks.get(t["rank"])
        if not check(r is not None, f"dlrm: rank {t['rank']} missing"):
            continue
        ours = r["trace_analysis"]["temporal"][0]
        for k, h in (("idle_pct", "idle_time_pctg"), ("compute_pct", "compute_time_pctg"),
                     ("non_compute_pct", "non_compute_time_pctg")):
            check(abs(ours[k] - t[h]) <= 1.0, f"dlrm rank {t['rank']} {k}: stallbench {ours[k]:.2f} vs HTA {t[h]}")
        print(f"  dlrm rank {t['rank']}: idle {ours['idle_pct']:.2f} (HTA {t['idle_time_pctg']}), compute "
              f"{ours['compute_pct']:.2f} (HTA {t['compute_time_pctg']}), non-compute {ours['non_compute_pct']:.2f} "
              f"(HTA {t['non_compute_time_pctg']})")
    job_meta = doc["meta"]["job"]
    check(job_meta["clocks_agree"], f"dlrm: the collectives' ends disagree ({job_meta['end_spread_us']} us)")
    check(job_meta["straggler"] == 7, f"dlrm: straggler {job_meta['straggler']}, the README's is rank 7")
    f = first(doc)
    check(f.get("cause") == "a straggler rank", f"dlrm: first finding {f.get('cause')}, not the straggler")
    point = next(x for x in doc["points"] if x["params"]["check"] == "straggler")
    check(set(point["info"].get("also_late", [])) == {2, 6}, f"dlrm: also late {point['info'].get('also_late')}")
    check(point["info"].get("late_before_step") is True, "dlrm: rank 7's lateness not placed before its step")
    # the first all-to-all: rank 1 waits longest (7.63 ms in the README), rank 7 not at all
    waits = {r: ranks[r]["wait_ms"] for r in ranks}
    check(max(waits, key=waits.get) == 1 and waits[7] == min(waits.values()), f"dlrm: waits {waits}")
    check(f.get("speedup") is not None and f["evidence"].get("basis") == "modelled" and f["evidence"]["upper_bound"],
          f"dlrm: the straggler's gain is not a modelled upper bound: {f.get('evidence')}")
    with open(html, encoding="utf-8") as fh:
        text = fh.read()
    check(text.count("aria-label='rank ") == 8 and "rank 7 <b>(straggler)</b>" in text and "8 ranks" in text,
          "dlrm: the HTML has no per-rank small multiples naming the straggler")
    screenshot(html, tmp, "dlrm")
    print(f"  dlrm: first finding {f.get('cause')} (rank {job_meta['straggler']}), {f.get('speedup'):.2f}x "
          f"modelled; read in {doc['meta']['trace']['read_s']:.2f} s on {doc['meta']['trace']['threads']} threads")
    return True


def own_jobs(exe, schema_doc, own, tmp):
    for case in ("straggler-3r", "balanced-3r"):
        d = os.path.join(own, case)
        with open(os.path.join(d, "manifest.json")) as f:
            man = json.load(f)
        p, doc = run(exe, [d], os.path.join(tmp, case + ".json"))
        if not check(p.returncode == 0, f"{case}: exit {p.returncode}: {p.stderr[-400:]}"):
            continue
        errs = schema_check.errors(doc, schema_doc)
        check(not errs, f"{case}: result JSON against the schema: {errs[:3]}")
        got = doc["meta"]["job"]["straggler"]
        check(got == man["expected_straggler"], f"{case}: straggler {got}, made with {man['expected_straggler']}")
        causes = [x["cause"] for x in doc["findings"]]
        if man["expected_straggler"] is not None:
            check(causes[0] == "a straggler rank", f"{case}: first finding {causes[0]}")
            ev = doc["findings"][0]["evidence"]
            check(f"straggler@1:{man['expected_straggler']}" in ev.get("command", ""), f"{case}: {ev.get('command')}")
        else:
            check("a straggler rank" not in causes, f"{case}: a straggler named in a balanced job: {causes}")
        print(f"  {case}: straggler {got} (made: {man['expected_straggler']}), findings {causes}")
    # files one by one = their directory
    d = os.path.join(own, "straggler-3r")
    files = sorted(glob.glob(os.path.join(d, "rank*.pt.trace.json.gz")))
    p, doc = run(exe, files, os.path.join(tmp, "files.json"))
    check(p.returncode == 0 and doc["meta"]["job"]["straggler"] == 2, f"three files given: exit {p.returncode}")
    # one file given twice is one rank, read once; two files that both say rank 0 are exit 2
    p, doc = run(exe, [files[0], files[0]], os.path.join(tmp, "twice.json"))
    check(p.returncode == 0 and "job" not in doc["meta"], f"one file twice: exit {p.returncode}: {p.stderr[-300:]}")
    copy = os.path.join(tmp, "copy-of-" + os.path.basename(files[0]))
    shutil.copy(files[0], copy)
    p, _ = run(exe, [files[0], copy], os.path.join(tmp, "dup.json"))
    check(p.returncode == 2 and "both say rank 0" in p.stderr, f"one rank twice: exit {p.returncode}: {p.stderr[-300:]}")
    # an empty directory, a missing path, a directory of no trace
    empty = os.path.join(tmp, "empty")
    os.makedirs(empty)
    p, _ = run(exe, [empty], os.path.join(tmp, "e.json"))
    check(p.returncode == 2 and "no .json or .json.gz trace" in p.stderr, f"empty dir: exit {p.returncode}")
    p, _ = run(exe, [os.path.join(tmp, "nowhere")], os.path.join(tmp, "n.json"))
    check(p.returncode == 2 and "no such file" in p.stderr, f"missing path: exit {p.returncode}")
    bad = os.path.join(tmp, "bad")
    os.makedirs(bad)
    with open(os.path.join(bad, "rank0.pt.trace.json"), "w") as f:
        f.write('{"traceEvents": [')
    p, _ = run(exe, [bad], os.path.join(tmp, "b.json"))
    check(p.returncode == 2 and "rank0.pt.trace.json" in p.stderr, f"truncated rank trace: exit {p.returncode}: "
                                                                     f"{p.stderr[-300:]}")


def main():
    exe, schema, more, own = sys.argv[1:5]
    more = shared_data.directory(more, "traces-more")
    with open(schema) as f:
        schema_doc = json.load(f)
    with tempfile.TemporaryDirectory() as tmp:
        real = dlrm(exe, schema_doc, more, tmp)
        timeline(exe, more, tmp)
        own_jobs(exe, schema_doc, own, tmp)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("OK" + ("" if real else " (the real DLRM job skipped: its data is absent)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
