#!/usr/bin/env python3
"""The bash completion and the man page the build made from the binary (scripts/gen_completion.py,
help2man): completing in a real bash gives the commands, a scenario, its -p keys and choices, a
command's options; the man page names every command's options. usage: test_completion.py
STALLBENCH COMPLETION [MANPAGE]   (exit 77 without bash; the man page is checked when it exists)"""
import os
import subprocess
import sys

exe, completion = sys.argv[1], sys.argv[2]
manpage = sys.argv[3] if len(sys.argv) > 3 else ""
failures = []
if not os.path.exists("/bin/bash"):
    print("SKIP: no bash")
    sys.exit(77)

script = """
source "$1"
t() { COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]}-1)); COMPREPLY=(); _stallbench; echo "${COMPREPLY[*]}"; }
t stallbench di
t stallbench run pre
t stallbench run precision -p dty
t stallbench run numerics -p case=cu
t stallbench analyze-hang --js
t stallbench diagnose --base
"""
p = subprocess.run(["bash", "-c", script, "t", completion], capture_output=True, text=True, timeout=60)
got = p.stdout.splitlines()
want = [("diagnose", "stallbench di"), ("precision", "run pre"), ("dtype=bf16", "-p dty"),
        ("case=custom", "numerics -p case=cu"), ("--json", "analyze-hang --js"), ("--baseline", "diagnose --base")]
if p.returncode != 0 or len(got) != len(want):
    failures.append(f"bash: exit {p.returncode}, {len(got)} lines: {p.stdout!r} {p.stderr[-300:]!r}")
else:
    for line, (word, what) in zip(got, want):
        if word not in line.split():
            failures.append(f"completing '{what}': {line!r}, want {word}")

if manpage and os.path.exists(manpage):
    text = open(manpage, encoding="utf-8", errors="replace").read()
    for word in ("analyze-hang", "diagnose", "--trace", "--tolerance", "exit codes"):
        if word not in text:
            failures.append(f"{manpage}: no {word!r}")

for f in failures:
    print("FAIL", f)
print("completion:", "FAIL" if failures else "ok")
sys.exit(1 if failures else 0)
