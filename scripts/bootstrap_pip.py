#!/usr/bin/env python3
"""Installs pip into the running interpreter's venv from PyPI's pip wheel (no ensurepip).

Debian's python3 without the python3-venv package makes a venv only with --without-pip;
scripts/setup then runs this with the venv's python. pip's wheel runs from itself
(python pip.whl/pip install pip.whl), as its own docs describe. The wheel's sha256 from
PyPI's JSON API is checked; every request has a deadline.
"""
import hashlib
import json
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

TIMEOUT_S = 120


def main() -> int:
    if sys.prefix == sys.base_prefix:
        print("bootstrap_pip: run me with a venv's python, not the system's", file=sys.stderr)
        return 2
    index = "https://pypi.org/pypi/pip/json"
    with urllib.request.urlopen(index, timeout=TIMEOUT_S) as r:
        meta = json.load(r)
    wheels = [u for u in meta["urls"] if u["filename"].endswith("-py3-none-any.whl")]
    if not wheels:
        print("bootstrap_pip: PyPI lists no pip wheel", file=sys.stderr)
        return 1
    w = wheels[0]
    with urllib.request.urlopen(urllib.parse.urljoin(index, w["url"]), timeout=TIMEOUT_S) as r:
        data = r.read()
    if hashlib.sha256(data).hexdigest() != w["digests"]["sha256"]:
        print(f"bootstrap_pip: {w['filename']}: sha256 does not match PyPI's", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as d:
        whl = Path(d) / w["filename"]
        whl.write_bytes(data)
        return subprocess.run([sys.executable, str(whl / "pip"), "install", "-q", "--no-index", str(whl)],
                              timeout=TIMEOUT_S * 3).returncode


if __name__ == "__main__":
    sys.exit(main())
