#!/usr/bin/env python3
"""Debian's development packages for stallbench, fetched and unpacked without root.

For a user who cannot `apt-get install` (no sudo on a cluster node, a venv on a shared
machine): `apt-get download` and `dpkg-deb -x` need no privilege, so the packages the
build lacks are unpacked into a cache directory the build then uses (meson.build runs this
when `dependency()` finds a library missing and -Dfetch_deps is not disabled). Nothing is
installed on the system and dpkg's database is not touched.

    scripts/user_deps.py fmt yaml-0.1 dnnl        # Meson dependency names
    -> prints KEY<tab>VALUE lines (a path may hold '=' or ','): sysroot, include, libdir; one
       lib.NAME per file to link; one runtime.SONAME per shared library to carry

Where: $STALLBENCH_DEPS_CACHE, else $XDG_CACHE_HOME/stallbench/deps-<codename>-<arch>
(default ~/.cache). Apt's own package lists are used when this machine has them; else a
private `apt-get update` into the cache (no root needed either). Exit 2 with the list of
packages to ask an administrator for when there is no apt-get (not Debian or Ubuntu).
Every download has a deadline. Safe to run again: a finished set is not fetched twice.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# Meson dependency name -> (its Debian -dev package; the library files to link, none for
# header-only). The runtime packages they need are read from apt (apt-cache depends), so a
# release that renames them (libfmt9 in bookworm, libfmt10 in trixie) needs no change here.
PACKAGES: dict[str, tuple[list[str], list[str]]] = {
    "nlohmann_json": (["nlohmann-json3-dev"], []),
    "CLI11": (["libcli11-dev"], []),
    "fmt": (["libfmt-dev"], ["libfmt.so"]),
    "yaml-0.1": (["libyaml-dev"], ["libyaml.so"]),
    "simdjson": (["libsimdjson-dev"], ["libsimdjson.so"]),
    "zlib": (["zlib1g-dev"], ["libz.so"]),
    # oneDNN's library names libOpenCL.so.1 (the ICD loader) in DT_NEEDED: linked too, so the
    # program's own RUNPATH finds it (a RUNPATH is not inherited by the libraries it loads)
    "dnnl": (["libdnnl-dev"], ["libdnnl.so", "libOpenCL.so.1"]),
    "gtest": (["libgtest-dev"], ["libgtest.a"]),
    "gtest_main": (["libgtest-dev"], ["libgtest_main.a"]),
    "benchmark": (["libbenchmark-dev"], ["libbenchmark.so"]),
}
# What every Debian system has (the C and C++ runtimes, zlib) or what the build never uses
# (googletest's sources, the C library's headers): never fetched.
BASE = {"libc6", "libgcc-s1", "libstdc++6", "libgomp1", "zlib1g", "libc6-dev", "libc-dev", "googletest",
        "libc-dev-bin", "linux-libc-dev"}
DEADLINE_S = 600


def die(msg: str, code: int = 2) -> None:
    print(f"user_deps: {msg}", file=sys.stderr)
    sys.exit(code)


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=DEADLINE_S, **kw)
    except subprocess.TimeoutExpired:
        die(f"{' '.join(cmd[:3])} ... took over {DEADLINE_S} s: is the Debian mirror reachable?", 1)
    raise AssertionError  # unreachable


def multiarch() -> str:
    r = run(["dpkg-architecture", "-qDEB_HOST_MULTIARCH"]) if shutil.which("dpkg-architecture") else None
    if r is not None and r.returncode == 0 and r.stdout.strip():
        return r.stdout.strip()
    return {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}.get(os.uname().machine,
                                                                             f"{os.uname().machine}-linux-gnu")


def cache_dir() -> Path:
    if os.environ.get("STALLBENCH_DEPS_CACHE"):
        return Path(os.environ["STALLBENCH_DEPS_CACHE"]).resolve()
    codename = "unknown"
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("VERSION_CODENAME="):
                codename = line.split("=", 1)[1].strip('"') or codename
    except OSError:
        pass
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return (base / "stallbench" / f"deps-{codename}-{os.uname().machine}").resolve()


def depends(pkg: str, apt_opts: list[str]) -> list[str]:
    """The packages `pkg` depends on (alternatives too, not virtual names), from apt-cache."""
    r = run(["apt-cache", *apt_opts, "depends", "--no-recommends", "--no-suggests", "--no-conflicts",
             "--no-breaks", "--no-replaces", "--no-enhances", pkg])
    if r.returncode != 0:
        return []
    return re.findall(r"^\s*\|?(?:Pre)?Depends: ([^<\s]\S*)$", r.stdout, re.M)


def with_runtime(dev: list[str], apt_opts: list[str]) -> list[str]:
    """The -dev packages and what they need beyond the base system, two levels down (-dev ->
    library -> what the library loads: oneDNN's OpenCL loader)."""
    want, frontier = set(dev), list(dev)
    for _ in range(2):
        nxt = []
        for p in frontier:
            for d in depends(p, apt_opts):
                d = d.split(":")[0]  # libfoo:amd64
                if d not in BASE and d not in want:
                    want.add(d)
                    nxt.append(d)
        frontier = nxt
    return sorted(want)


def apt_options(probe: str, apt_dir: Path) -> list[str]:
    """apt's options that know the packages: none when this machine's lists have `probe`; else a
    private package list in the cache, read from the mirror (apt-get update needs no root so)."""
    if run(["apt-cache", "show", probe]).returncode == 0:
        return []
    private = ["-o", f"Dir::State::Lists={apt_dir}/lists", "-o", f"Dir::Cache={apt_dir}/cache",
               "-o", "Debug::NoLocking=1"]
    if run(["apt-cache", *private, "show", probe]).returncode == 0:
        return private
    print(f"user_deps: this machine's package lists do not have {probe}; reading the mirror's into "
          f"{apt_dir} (no root needed)", file=sys.stderr)
    for d in ("lists/partial", "cache/archives/partial"):
        (apt_dir / d).mkdir(parents=True, exist_ok=True)
    u = run(["apt-get", *private, "update"])
    if u.returncode != 0:
        die(f"apt-get update (private lists) failed:\n{u.stderr.strip()[-800:]}", 1)
    if run(["apt-cache", *private, "show", probe]).returncode != 0:
        die(f"the Debian mirror has no {probe}: install it, or its equivalent, and configure again", 1)
    return private


def apt_download(pkgs: list[str], debs: Path, apt_opts: list[str]) -> None:
    debs.mkdir(parents=True, exist_ok=True)
    r = run(["apt-get", *apt_opts, "download", *pkgs], cwd=debs)
    if r.returncode != 0:
        die(f"apt-get download {' '.join(pkgs)} failed:\n{r.stderr.strip()[-800:]}", 1)


def relink(sysroot: Path) -> None:
    """Absolute links into /usr that the sysroot holds become relative, so they resolve inside it."""
    for link in sysroot.rglob("*"):
        if not link.is_symlink():
            continue
        target = os.readlink(link)
        if not target.startswith("/"):
            continue
        inside = sysroot / target.lstrip("/")
        if inside.exists() or inside.is_symlink():
            link.unlink()
            link.symlink_to(os.path.relpath(inside, link.parent))


def main(argv: list[str]) -> int:
    names = [a for a in argv if not a.startswith("-")]
    if not names or "-h" in argv or "--help" in argv:
        print(__doc__.strip())
        print("\nknown: " + ", ".join(PACKAGES))
        return 0 if names or "-h" in argv or "--help" in argv else 2
    unknown = [n for n in names if n not in PACKAGES]
    if unknown:
        die(f"no Debian package known for {', '.join(unknown)} (known: {', '.join(PACKAGES)})")
    dev = sorted({p for n in names for p in PACKAGES[n][0]})
    if not shutil.which("apt-get") or not shutil.which("dpkg-deb"):
        die("no apt-get here (not Debian or Ubuntu): install these development packages, or their "
            f"equivalents, and configure again: {' '.join(dev)}")
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    sysroot = cache / "sysroot"
    apt_dir = cache / "apt"
    # One configure at a time per cache: a second waits (builds in two trees at once)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        key = hashlib.sha256(" ".join(dev).encode()).hexdigest()[:16]
        done = cache / f".done-{key}"
        if not done.exists():
            opts = apt_options(dev[0], apt_dir)
            pkgs = with_runtime(dev, opts)
            print(f"user_deps: fetching {' '.join(pkgs)} from the Debian mirror into {cache} (no root)",
                  file=sys.stderr)
            debs = cache / "debs"
            shutil.rmtree(debs, ignore_errors=True)  # no stale version beside the one fetched now
            apt_download(pkgs, debs, opts)
            sysroot.mkdir(parents=True, exist_ok=True)
            for p in pkgs:
                found = list(debs.glob(f"{p}_*.deb"))
                if len(found) != 1:
                    die(f"apt-get download left {len(found)} {p}_*.deb in {debs}, want 1", 1)
                r = run(["dpkg-deb", "-x", str(found[0]), str(sysroot)])
                if r.returncode != 0:
                    die(f"dpkg-deb -x {found[0].name}: {r.stderr.strip()}", 1)
            relink(sysroot)
            done.write_text(" ".join(pkgs) + "\n")
    libdir = sysroot / "usr" / "lib" / multiarch()
    print(f"sysroot\t{sysroot}")
    print(f"include\t{sysroot / 'usr' / 'include'}")
    print(f"libdir\t{libdir}")
    for n in names:
        for lib in PACKAGES[n][1]:
            path = libdir / lib
            if not path.exists():
                die(f"{n}: {path} is missing after unpacking {' '.join(PACKAGES[n][0])}", 1)
            print(f"lib.{n}\t{path}")
    # The runtime libraries by the name the loader asks for (a soname link beside its file), for
    # an install that carries them (pip install . puts them in the package's _libs/).
    for link in sorted(libdir.glob("*.so.*")):
        if link.is_symlink() and "/" not in os.readlink(link) and (libdir / os.readlink(link)).is_file():
            print(f"runtime.{link.name}\t{(libdir / os.readlink(link)).resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
