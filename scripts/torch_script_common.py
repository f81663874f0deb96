"""What scripts/torch_matmul.py and scripts/torch_sdpa.py share: argument types, an atomic
JSON write, and reading an input JSON with a message naming it. Standard library only, so
both scripts' --help and --compare run without torch."""
import argparse
import json
import math
import os
import tempfile


def positive_int(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"wants a positive integer, got {text!r}")
    if v <= 0:
        raise argparse.ArgumentTypeError(f"wants a positive integer, got {text!r}")
    return v


def int_list(text):
    try:
        v = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"wants a comma list of positive integers, got {text!r}")
    if not v or any(x <= 0 for x in v):
        raise argparse.ArgumentTypeError(f"wants a comma list of positive integers, got {text!r}")
    return v


def positive_float(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"wants a positive number, got {text!r}")
    if not v > 0 or math.isinf(v):
        raise argparse.ArgumentTypeError(f"wants a positive number, got {text!r}")
    return v


def write_json_atomic(path, doc):
    """Writes doc to path: a temporary file in the same directory, fsync'd, then renamed."""
    path = os.path.abspath(path)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=os.path.dirname(path))
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual mode
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def load_json(path, tool):
    """The document at path, or SystemExit (exit 1) naming the tool, the file and what is wrong."""
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise SystemExit(f"{tool}: cannot read {path}: {e.strerror}")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SystemExit(f"{tool}: {path} is not JSON: {e}")
