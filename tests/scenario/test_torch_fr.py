#!/usr/bin/env python3
"""`stallbench analyze-hang` on real PyTorch Flight Recorder dumps.

tests/data/fr holds dumps made by PyTorch 2.15's gloo process group (pickle and
JSON forms; tests/data/fr/make_dumps.py), each case with a manifest.json that
says what the job did and what the answer must be (kind, collective seq,
culprit rank). Every case must be named right, in both forms, through the
CLI, and the report must be valid JSON with the fields users read. Where the
dumps themselves cannot show the answer (the culprit's dump lost and gloo
retiring a timed-out call as completed; a JSON dump taken after the state
settled), the manifest's `expected_stallbench` says what stallbench must
answer instead, per form, and why.

A case whose ranks wait on each other in a ring (the group-order cases, and
p2p-missing, where the last stage went on to the all-reduce its peer never
reached) names the ring in `expected.wait_cycle`, and may accept any of its
ranks as the culprit (`expected.culprit_in`); every other case must report no
ring.

Usage: test_torch_fr.py STALLBENCH DATA_DIR
"""
import json
import os
import re
import subprocess
import sys

# The manifest's kinds (PyTorch's vocabulary) and analyze-hang's.
KINDS = {None: "none", "healthy": "none", "missing": "missing", "collective_type": "op", "op": "op",
         "size": "count", "count": "count", "allgather_count": "count", "dtype": "dtype", "state": "state"}


def main():
    stallbench, data = sys.argv[1], sys.argv[2]
    cases = sorted(d for d in os.listdir(data) if os.path.isfile(os.path.join(data, d, "manifest.json")))
    if not cases:
        print(f"no cases with a manifest.json in {data}")
        return 1
    failures, checked, refused = [], 0, 0  # refused: cases fr_trace refused, checked against its answer
    for case in cases:
        with open(os.path.join(data, case, "manifest.json")) as f:
            manifest = json.load(f)
        for form in (case, case + "-json"):
            path = os.path.join(data, form)
            if not os.path.isdir(path):
                continue
            want = manifest.get("expected_stallbench", {}).get("json" if form.endswith("-json") else "pickle",
                                                                manifest["expected"])
            r = subprocess.run([stallbench, "analyze-hang", path, "--json"], capture_output=True, text=True,
                               timeout=60)
            if r.returncode != 0:
                failures.append(f"{form}: exit {r.returncode}: {r.stderr.strip()[-300:]}")
                continue
            rep = json.loads(r.stdout)
            got = (rep["kind"], rep["seq"] if rep["kind"] != "none" else None,
                   rep["culprits"][0] if len(rep["culprits"]) == 1 else rep["culprits"] or None)
            exp = (KINDS.get(want.get("kind"), want.get("kind")), want.get("seq"), want.get("culprit"))
            if "culprit_in" in want:
                # a ring of waits: which of its calls went unanswered first is a race of the run, so the
                # missing rank named may be any of the ring's; the seq is the ring's own
                got = (got[0], None, got[2])
                if rep["culprits"] and set(rep["culprits"]) <= set(want["culprit_in"]):
                    exp = (exp[0], None, got[2])
            if got != exp:
                failures.append(f"{form}: got kind/seq/culprit {got}, the manifest says {exp}: {rep['summary']}")
            # the ring of waits through the culprit (ranks, sorted): none unless the manifest names one
            ring = sorted(w["rank"] for w in rep.get("wait_cycle", []))
            if ring != (want.get("wait_cycle") or []):
                failures.append(f"{form}: wait cycle {ring}, the manifest says {want.get('wait_cycle')}: "
                                f"{rep['summary']}")
            # the ranks without a dump named as suspects, with how sure (issue 56): where the manifest says
            if "suspect" in want:
                sus = rep.get("suspect", {})
                if sus.get("ranks") != want["suspect"]["ranks"] or sus.get("confidence") != want["suspect"]["confidence"]:
                    failures.append(f"{form}: suspect {sus.get('ranks')} ({sus.get('confidence')}), the manifest says "
                                    f"{want['suspect']}: {rep['summary']}")
                elif not sus.get("evidence") or not sus.get("decides"):
                    failures.append(f"{form}: the suspect comes without evidence or what decides it: {sus}")
            elif rep.get("suspect"):
                failures.append(f"{form}: names suspects {rep['suspect'].get('ranks')} the manifest does not: "
                                f"{rep['summary']}")
            if rep.get("format") != "pytorch-flight-recorder":
                failures.append(f"{form}: format {rep.get('format')!r}")
            for rank in want.get("dump_missing", manifest.get("dump_missing", [])):
                if rank not in rep["ranks_missing"]:
                    failures.append(f"{form}: rank {rank}'s dump is gone but ranks_missing is {rep['ranks_missing']}")
            # fr_trace's own answer (committed beside the dumps): an incomplete set is refused by name, and
            # the report says so (it once said FULLY_MATCHED with a dump missing); never FULLY_MATCHED then.
            peer = os.path.join(data, case, "fr_trace.txt")
            if os.path.exists(peer):
                m = re.search(r"Missing dump files from ranks \{[0-9, ]*\}", open(peer).read())
                if m:
                    refused += 1
                    t = subprocess.run([stallbench, "analyze-hang", path], capture_output=True, text=True,
                                       timeout=60)
                    if m.group(0) not in t.stdout or "FULLY_MATCHED" in t.stdout:
                        failures.append(f"{form}: fr_trace says {m.group(0)!r}; stallbench's report: "
                                        f"{t.stdout[:400]}")
            if want.get("kind") == "missing" or rep["kind"] == "missing":
                # The table: a rank whose pg_status counts the call that not every rank joined (retired
                # after it failed) is marked, and the note says why; no other rank is.
                t = subprocess.run([stallbench, "analyze-hang", path], capture_output=True, text=True, timeout=60)
                seq = rep["seq"]
                marked = [ln for ln in t.stdout.splitlines() if ln.rstrip().endswith("\"") and " * " in ln]
                counted = [x["rank"] for x in rep["ranks"] if x["last_completed_seq"] >= seq]
                if len(marked) != len(counted) or (counted and f"includes seq {seq}, which not every rank joined"
                                                   not in t.stdout):
                    failures.append(f"{form}: ranks counting seq {seq} as completed {counted}, marked rows "
                                    f"{len(marked)}: {t.stdout[-600:]}")
            checked += 1
            print(f"{form:28s} {got[0]:8s} seq {str(got[1]):5s} culprit {got[2]}  ({rep['torch_match_state']})")
    if refused == 0:
        failures.append("no case fr_trace refused for a missing dump was checked (tests/data/fr/*/fr_trace.txt)")
    for f in failures:
        print("FAIL", f)
    print(f"{checked - len(failures)} passed, {len(failures)} failed")
    return 1 if failures or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
