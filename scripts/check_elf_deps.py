#!/usr/bin/env python3
"""Check that every shared library an ELF file needs will be found on the GPU machine.

    check_elf_deps.py [--provided DIR]... FILE_OR_DIR...

Reads DT_NEEDED of each ELF file given (and of every ELF file in a directory given),
then of every library found in a --provided directory, transitively. Each needed name
must be one of:
  - a file in a --provided directory (the bundle, .deps/lib, or a wheel's lib/), or
  - a library that machine is known to have: glibc's, the GCC runtime's, and CUDA's
    (toolkit and driver), listed below.
Exit 0 when all are resolved; 1 with each missing name and who needs it; 2 on bad usage.
Parses ELF itself (no readelf on the GPU machine's image is assumed).
"""
import os
import re
import struct
import sys

# What the GPU machine is known to have outside the bundle (issue #10's list):
# glibc, libstdc++/libgcc_s/libgomp, and the CUDA toolkit's and driver's libraries.
KNOWN_PRESENT = [
    r"ld-linux-x86-64\.so\.2", r"libc\.so\.6", r"libm\.so\.6", r"libpthread\.so\.0", r"libdl\.so\.2",
    r"librt\.so\.1", r"libutil\.so\.1", r"libresolv\.so\.2",
    r"libstdc\+\+\.so\.6", r"libgcc_s\.so\.1", r"libgomp\.so\.1",
    r"libcuda\.so\.1", r"libnvidia-ml\.so\.1",
    r"libcudart\.so\.\d+", r"libcublas\.so\.\d+", r"libcublasLt\.so\.\d+", r"libnvrtc\.so\.\d+",
    r"libnvrtc-builtins\.so.*", r"libnvJitLink\.so\.\d+", r"libcupti\.so.*",
]
_KNOWN = [re.compile("^" + p + "$") for p in KNOWN_PRESENT]


def elf_needed(path):
    """DT_NEEDED names of a 64-bit little-endian ELF file, or None if it is not one."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    e_phoff, = struct.unpack_from("<Q", data, 0x20)
    e_phentsize, e_phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(e_phnum):
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from("<IIQQQQ", data, e_phoff + i * e_phentsize)
        if p_type == 1:  # PT_LOAD
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == 2:  # PT_DYNAMIC
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return []  # static

    def vaddr_to_off(v):
        for vaddr, off, size in loads:
            if vaddr <= v < vaddr + size:
                return off + (v - vaddr)
        raise ValueError(f"{path}: address {v:#x} is in no PT_LOAD segment")

    needed, strtab = [], None
    off, end = dynamic[0], dynamic[0] + dynamic[1]
    while off + 16 <= end:
        tag, val = struct.unpack_from("<qQ", data, off)
        off += 16
        if tag == 0:
            break
        if tag == 1:
            needed.append(val)
        elif tag == 5:  # DT_STRTAB
            strtab = vaddr_to_off(val)
    if strtab is None:
        return []
    names = []
    for n in needed:
        stop = data.index(b"\0", strtab + n)
        names.append(data[strtab + n:stop].decode())
    return names


def main(argv):
    provided_dirs, targets = [], []
    it = iter(argv)
    for a in it:
        if a == "--provided":
            d = next(it, None)
            if not d:
                print("check_elf_deps: --provided needs a directory", file=sys.stderr)
                return 2
            provided_dirs.append(d)
        elif a in ("-h", "--help"):
            print(__doc__)
            return 0
        else:
            targets.append(a)
    if not targets:
        print(__doc__, file=sys.stderr)
        return 2
    provided = {}
    for d in provided_dirs:
        if os.path.isdir(d):
            for name in os.listdir(d):
                provided.setdefault(name, os.path.join(d, name))
    files = []
    for t in targets:
        if os.path.isdir(t):
            files += [os.path.join(t, n) for n in sorted(os.listdir(t)) if os.path.isfile(os.path.join(t, n))]
        elif os.path.isfile(t):
            files.append(t)
        else:
            print(f"check_elf_deps: {t}: no such file or directory", file=sys.stderr)
            return 2
    missing, seen, queue = {}, set(), list(files)
    checked = 0
    while queue:
        path = os.path.realpath(queue.pop())
        if path in seen:
            continue
        seen.add(path)
        needed = elf_needed(path)
        if needed is None:
            continue
        checked += 1
        for name in needed:
            if name in provided:
                queue.append(provided[name])
            elif not any(k.match(name) for k in _KNOWN):
                missing.setdefault(name, []).append(os.path.basename(path))
    for name, who in sorted(missing.items()):
        print(f"check_elf_deps: {name} is needed by {', '.join(sorted(set(who)))} and is neither bundled "
              "nor known to be on the GPU machine", file=sys.stderr)
    print(f"check_elf_deps: {checked} ELF files, {len(missing)} unresolved names")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
