"""The `stallbench` command of a pip install: runs the binary the package carries.

pip puts this console script on the venv's PATH; the binary itself lives in the package
(site-packages/stallbench/_bin/stallbench) beside the libraries and data it finds relative
to itself, so it is run as is: same arguments, same exit code, signals reach it directly.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path


def binary() -> Path:
    """The binary this package carries (a pip install); else the one $STALLBENCH_BIN names."""
    env = os.environ.get("STALLBENCH_BIN")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent / "_bin" / "stallbench"


def main() -> None:
    exe = binary()
    if os.path.realpath(exe) == os.path.realpath(sys.argv[0]):  # STALLBENCH_BIN=$(which stallbench)
        sys.stderr.write(f"stallbench: STALLBENCH_BIN names this launcher ({exe}), not the binary\n")
        sys.exit(2)
    if not os.access(exe, os.X_OK):
        sys.stderr.write(f"stallbench: no binary at {exe}: this package was not installed by "
                         "`pip install` (set STALLBENCH_BIN to a built stallbench)\n")
        sys.exit(2)
    # replaces this process: exit code and signals are the binary's; argv[0] is the command's name
    # (its help says "Usage: stallbench ..."), the binary finds itself by /proc/self/exe
    os.execv(str(exe), ["stallbench", *sys.argv[1:]])


if __name__ == "__main__":
    main()
