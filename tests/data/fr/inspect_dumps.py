#!/usr/bin/env python3
"""Summarise the committed FR dumps: pickle opcodes, GLOBALs, pickle-vs-JSON
differences, and the cases table (prints Markdown used in README.md).
Needs only the standard library."""
import glob
import json
import os
import pickle
import pickletools
import re
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))


def opcodes():
    ops, globs, protos = Counter(), set(), set()
    for fn in sorted(glob.glob(os.path.join(HERE, "*r", "rank_*"))):
        data = open(fn, "rb").read()
        for op, arg, _ in pickletools.genops(data):
            ops[op.name] += 1
            if op.name == "PROTO":
                protos.add(arg)
            if op.name in ("GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "NEWOBJ"):
                globs.add((op.name, arg))
    return ops, globs, protos


def types_of(x):
    if isinstance(x, dict):
        return {k: types_of(v) for k, v in x.items()}
    return type(x).__name__


def differences():
    diffs = Counter()
    for fn in sorted(glob.glob(os.path.join(HERE, "*r", "rank_*"))):
        d = os.path.dirname(fn)
        jf = os.path.join(d + "-json", os.path.basename(fn))
        if not os.path.exists(jf):
            continue
        p = pickle.load(open(fn, "rb"))
        j = json.load(open(jf))
        for k in set(p) | set(j):
            if k not in j:
                diffs[f"top-level key `{k}` only in pickle"] += 1
            elif k not in p:
                diffs[f"top-level key `{k}` only in JSON"] += 1
        for pg, st in p["pg_status"].items():
            for k, v in st.items():
                jv = j["pg_status"][pg][k]
                if type(v) is not type(jv):
                    diffs[f"pg_status.*.{k}: pickle {type(v).__name__} vs JSON {type(jv).__name__}"] += 1
        for pe, je in zip(p["entries"], j.get("entries", [])):
            for k in set(pe) | set(je):
                if k not in je:
                    diffs[f"entry key `{k}` only in pickle"] += 1
                elif k not in pe:
                    diffs[f"entry key `{k}` only in JSON"] += 1
                elif type(pe[k]) is not type(je[k]):
                    diffs[f"entry `{k}`: pickle {type(pe[k]).__name__} {pe[k]!r:.20} vs JSON {type(je[k]).__name__} {je[k]!r:.20}"] += 1
                elif pe[k] != je[k]:
                    diffs[f"entry `{k}` value differs"] += 1
        if len(p["entries"]) != len(j.get("entries", [])):
            diffs["number of entries differs"] += 1
    return diffs


if __name__ == "__main__":
    ops, globs, protos = opcodes()
    print("protocols:", sorted(protos))
    print("opcodes:", ", ".join(f"{k} ({v})" for k, v in sorted(ops.items())))
    print("globals:", sorted(globs))
    for k, v in sorted(differences().items()):
        print(f"- {k}  [{v}]")


KIND_OF = {"COLLECTIVE_TYPE_MISMATCH": "collective_type", "SIZE_OR_SYNTAX_MISMATCH": "size",
           "COLLECTIVE_DTYPE_MISMATCH": "dtype", "COLLECTIVE_STATE_MISMATCH": "state"}


def parse_fr(text):
    """First finding of fr_trace output -> (kind, seq, culprit, short)."""
    m = re.search(r"Not all ranks joining collective, sequence number: (\d+).*?missing ranks: \{([^}]*)\}", text, re.S)
    e = re.search(r"Collective sequence number: (\d+) has errors.*?error msg: Culprit rank (\d+); Error type: (\w+)(.*)", text)
    e = re.search(r"Collective sequence number: (\d+) has errors.*?error msg: Culprit rank (\d+); Error type: (\w+)([^\n]*)", text, re.S)
    found = []
    if m:
        found.append((m.start(), "missing", int(m.group(1)), m.group(2), f"Not all ranks joining, seq {m.group(1)}, missing {{{m.group(2)}}}"))
    if e:
        cul = sorted({e.group(2)} | set(re.findall(r"Culprit rank (\d+)", e.group(4))), key=int)
        found.append((e.start(), KIND_OF.get(e.group(3), e.group(3)), int(e.group(1)), cul,
                      f"seq {e.group(1)}: {e.group(3)}, 'Culprit rank' {','.join(cul)}"))
    if not found:
        if "[exit code 0]" in text:
            return None, None, None, "no finding (exit 0)"
        last = [l for l in text.splitlines() if l.strip() and not l.startswith("[exit")][-1]
        return "error", None, None, "fails: " + last[:90]
    _, k, s, c, short = min(found)
    return k, s, c, short


def table():
    rows = []
    for d in sorted(glob.glob(os.path.join(HERE, "*r"))):
        if not os.path.exists(os.path.join(d, "manifest.json")):
            continue
        m = json.load(open(os.path.join(d, "manifest.json")))
        ex = m["expected"]
        raw = open(os.path.join(d, "fr_trace.txt")).read()
        rk, _, _, rshort = parse_fr(raw)
        fixes = sorted(glob.glob(os.path.join(d, "fr_trace_pgfix*.txt")))
        cells = []
        agree = []
        for f in fixes:
            k, s, c, short = parse_fr(open(f).read())
            tag = "allow-incomplete: " if "allow_incomplete" in f else ""
            cells.append(tag + short)
            if k == "error":
                agree.append("n/a")
            elif not ex["kind"]:
                agree.append("yes" if k is None else "no")
            elif k != ex["kind"] or s != ex["seq"]:
                agree.append("no")
            elif k == "missing":
                agree.append("yes" if c == str(ex["culprit"]) else "culprit differs")
            else:
                agree.append("yes" if c == [str(ex["culprit"])] else
                             "kind+seq yes; names the other ranks" if str(ex["culprit"]) not in c
                             else "kind+seq yes; culprit differs")
        rows.append(f"| {os.path.basename(d)} | {ex['kind'] or '-'} | {m['world_size']} | "
                    f"{ex['culprit'] if ex['culprit'] is not None else '-'} | {ex['seq'] or '-'} | "
                    f"{rshort} | {'<br>'.join(cells)} | {'/'.join(agree)} |")
    print("| dir | expected kind | ranks | culprit | seq | fr_trace on the dumps as made | fr_trace, pg_config rebuilt | agrees |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    print()
    table()
