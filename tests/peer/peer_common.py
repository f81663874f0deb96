"""What the peer scripts share: comma lists on the command line, the machine's CPU as a
result names it, and the JSON + Markdown pair written atomically."""
import argparse
import json
import os


def parse_list(text, kind):
    try:
        return [kind(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma list of {kind.__name__}: {text!r}")


def add_run_arguments(ap):
    """The options every interleaved peer run takes: rounds, warm-up, repetitions, torch's threads,
    the stallbench binary, its timeout, the output."""
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds; the table shows their median")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--stallbench", default="build/stallbench")
    ap.add_argument("--timeout", type=float, default=900, help="seconds for one stallbench run")
    ap.add_argument("--out", default="", help="JSON path (the .md table is written beside it)")


def cpu_kind():
    model, flags = "", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    isa = [x for x in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if x in flags]
    return {"model": model, "isa": isa, "cores": os.cpu_count()}


def write_pair(out, doc, table):
    """doc as JSON at out, the Markdown table beside it (.md), each through a temporary file and a rename."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    for path, text in ((out, json.dumps(doc, indent=2) + "\n"), (os.path.splitext(out)[0] + ".md", table + "\n")):
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
