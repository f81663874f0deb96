#!/usr/bin/env python3
"""Print key=path lines for CUDA libraries that live in pip wheels.

The GPU machine has cuDNN and NCCL only as wheels (site-packages/nvidia/...),
and cudnn-frontend's C++ headers come from the nvidia-cudnn-frontend wheel
(site-packages/include). meson.build reads these lines; missing ones are
simply not printed. Never fails.
"""
import importlib.util
import os
import site
import sys


def site_dirs():
    dirs = []
    try:
        dirs += site.getsitepackages()
    except Exception:
        pass
    try:
        dirs.append(site.getusersitepackages())
    except Exception:
        pass
    dirs += [p for p in sys.path if p.endswith("site-packages")]
    seen = []
    for d in dirs:
        if d and os.path.isdir(d) and d not in seen:
            seen.append(d)
    return seen


def main():
    out = {}
    for d in site_dirs():
        for name in ("cudnn", "nccl"):
            base = os.path.join(d, "nvidia", name)
            inc, lib = os.path.join(base, "include"), os.path.join(base, "lib")
            if f"{name}_include" not in out and os.path.isdir(inc):
                out[f"{name}_include"] = inc
            if f"{name}_lib" not in out and os.path.isdir(lib):
                out[f"{name}_lib"] = lib
                # Wheels ship only versioned names (libcudnn.so.9), which
                # find_library does not see: hand meson the file itself.
                sos = sorted(f for f in os.listdir(lib) if f.startswith(f"lib{name}.so"))
                if sos:
                    out[f"{name}_so"] = os.path.join(lib, sos[0])
        fe = os.path.join(d, "include")
        if "cudnn_frontend_include" not in out and os.path.isfile(os.path.join(fe, "cudnn_frontend.h")):
            out["cudnn_frontend_include"] = fe
    # A machine with no registry gets the frontend's headers in a carried
    # bundle (scripts/bundle-deps): $STALLBENCH_DEPS_PREFIX or <repo>/.deps.
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for prefix in (os.environ.get("STALLBENCH_DEPS_PREFIX", ""), os.path.join(repo, ".deps")):
        inc = os.path.join(prefix, "include") if prefix else ""
        if "cudnn_frontend_include" not in out and inc and os.path.isfile(os.path.join(inc, "cudnn_frontend.h")):
            out["cudnn_frontend_include"] = inc
    spec = importlib.util.find_spec("cudnn")
    if "cudnn_frontend_include" not in out and spec and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            for cand in (os.path.join(loc, "include"), os.path.join(os.path.dirname(loc), "include")):
                if os.path.isfile(os.path.join(cand, "cudnn_frontend.h")):
                    out["cudnn_frontend_include"] = cand
    for k, v in out.items():
        print(f"{k}={v}")


if __name__ == "__main__":
    main()
