#!/usr/bin/env python3
"""Writes the three made-up telemetry fixtures of this folder (README.md says
which files are real recordings and which are made):

  nvsmi_8gpu_100ms.csv   nvidia-smi --query-gpu=timestamp,index,name,pci.bus_id,
                         utilization.gpu,utilization.memory,clocks.sm,clocks.max.sm,
                         power.draw,enforced.power.limit,temperature.gpu,memory.used,
                         memory.total,clocks_event_reasons.active,pstate
                         --format=csv -lms 100, 8 GPUs, 70 readings (560 rows), with
                         nvidia-smi restarted after reading 59 (the header written
                         again, the clock 2.5 s later) and [N/A] power on GPU 7.
  dcgmi_4gpu_100ms.txt   dcgmi dmon -e 203,204,100,155,150,252,250,112,1002,1003,1004,
                         1005,1009,1010 -d 100, 4 GPUs, 100 ticks (400 rows), the
                         header reprinted as dcgmi does (after tick 14, then every
                         14 ticks), N/A where DCGM has no value yet, and the line
                         dcgmi prints when stopped with Ctrl-C.
  nvsmi_3gpu_no_index.csv  nvidia-smi --query-gpu=timestamp,name,utilization.gpu,
                         memory.used --format=csv -l 1 on 3 GPUs, without index
                         (nor pci.bus_id, uuid): each reading's three rows stamped
                         a few ms apart (11:27:05.177, .188, .192), 20 readings.
                         GPUs 0 and 2 busy, GPU 1 idle: read as one GPU it would
                         look spiky. The reader must refuse it.

The values follow closed formulas (no randomness), so the tests can state
exact values. The layout is nvidia-smi's (", " between values, the unit after
each value, the header's long names: clocks.current.sm for clocks.sm) as in
the real nvsmi_v100s_1gpu.csv, and dcgmi's as DCGM's dcgmi/DeviceMonitor.cpp
prints it: "#Entity" and "GPU <id>" padded to 10, each field's short name,
unit and value left-aligned in (its dcgm_fields.cpp width + 6) + 2 columns,
doubles with 3 decimals, as in the real dcgmi_h800_pcie.txt.

Run from anywhere: python3 tests/data/telemetry/make_fixtures.py
"""
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def nvsmi():
    header = ("timestamp, index, name, pci.bus_id, utilization.gpu [%], utilization.memory [%], "
              "clocks.current.sm [MHz], clocks.max.sm [MHz], power.draw [W], enforced.power.limit [W], "
              "temperature.gpu, memory.used [MiB], memory.total [MiB], clocks_event_reasons.active, pstate")
    buses = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]
    lines = [header]
    start_ms = 12 * 3600 * 1000  # 2024/05/01 12:00:00.000
    for r in range(70):
        if r == 60:
            lines.append(header)  # nvidia-smi restarted, appending to the same file
        base = start_ms + r * 100 + r // 3 + (2500 if r >= 60 else 0)
        for g in range(8):
            ms = base + 2 * g  # nvidia-smi reads the GPUs one after another
            stamp = "2024/05/01 {:02d}:{:02d}:{:02d}.{:03d}".format(ms // 3600000, ms // 60000 % 60, ms // 1000 % 60, ms % 1000)
            util = 0 if r < 5 else (r * 7 + g * 13) % 101
            mem_util = util * 3 // 5
            idle = util == 0
            clock = 345 if idle else 1980 - (45 * g if util > 90 else 0)
            power = 70.0 + g * 1.25 if idle else min(700.0, 150.0 + util * 5.5 + g * 0.75)
            reasons = 0x1 if idle else (0x4 if power >= 700.0 else 0x0)
            temp = 31 + g + util // 10
            used = 0 if r < 3 else 1024 * (g + 1) + 512 * (r % 10)
            power_text = "[N/A]" if g == 7 and r % 10 == 0 else "{:.2f} W".format(power)
            lines.append("{}, {}, NVIDIA H100 80GB HBM3, 00000000:{}:00.0, {} %, {} %, {} MHz, 1980 MHz, {}, 700.00 W, {}, "
                         "{} MiB, 81559 MiB, 0x{:016x}, P0".format(stamp, g, buses[g], util, mem_util, clock, power_text, temp,
                                                                  used, reasons))
    return "\n".join(lines) + "\n"


def nvsmi_no_index():
    lines = ["timestamp, name, utilization.gpu [%], memory.used [MiB]"]
    start_ms = (11 * 60 + 27) * 60000 + 5177  # 2025/03/14 11:27:05.177
    for r in range(20):
        base = start_ms + r * 1000 + (r * 7) % 5  # -l 1: a reading a second, a few ms of jitter
        for g, offset in enumerate((0, 11 + r % 3, 15 + r % 4)):  # nvidia-smi reads the GPUs one after another
            ms = base + offset
            stamp = "2025/03/14 {:02d}:{:02d}:{:02d}.{:03d}".format(ms // 3600000, ms // 60000 % 60, ms // 1000 % 60, ms % 1000)
            util = 0 if g == 1 else 96 + (r + g) % 4
            used = 512 if g == 1 else 61000 + 100 * g
            lines.append("{}, NVIDIA A100-SXM4-80GB, {} %, {} MiB".format(stamp, util, used))
    return "\n".join(lines) + "\n"


# short name, dcgm_fields.cpp width, unit as dcgmi prints it, double?
DCGM_FIELDS = [("GPUTL", 10, "", False), ("MCUTL", 10, "", False), ("SMCLK", 5, "", False), ("POWER", 10, " W", True),
               ("TMPTR", 5, " C", False), ("FBUSD", 10, "", False), ("FBTTL", 10, "", False), ("DVCCTR", 20, "", False),
               ("SMACT", 5, "", True), ("SMOCC", 5, "", True), ("TENSO", 5, "", True), ("DRAMA", 5, "", True),
               ("PCITX", 20, "", False), ("PCIRX", 20, "", False)]


def cell(text, width):
    """A value as DeviceMonitor.cpp prints it: cut to width + 6, padded to width + 8."""
    w = width + 6
    if len(text) > w:
        text = text[:w - 3] + "..."
    return text.ljust(w + 2)


def dcgmi():
    head = "#Entity".ljust(10) + "".join(cell(n, w) for n, w, _, _ in DCGM_FIELDS)
    units = "ID".ljust(10) + "".join(cell(u, w) for _, w, u, _ in DCGM_FIELDS)
    out = [head, units]
    printed = 0  # dcgmi's printHeaderCount
    for t in range(100):
        for g in range(4):
            util = (t * 9 + g * 17) % 101
            sm_active = util / 100 * 0.8
            values = {
                "GPUTL": util, "MCUTL": util // 2, "SMCLK": 1410 if util else 210,
                "POWER": 60.0 + util * 3.4 + g * 0.125, "TMPTR": 35 + util // 5 + g,
                "FBUSD": 512 + t * 37 + g * 1000, "FBTTL": 81920, "DVCCTR": 4 if util > 95 else (1 if util == 0 else 0),
                "SMACT": sm_active, "SMOCC": sm_active * 0.5, "TENSO": None if (g == 3 and t < 2) else sm_active * 0.25,
                "DRAMA": util / 100 * 0.4,
                "PCITX": None if t == 0 else 1000000 * (t % 7) + 4096 * g, "PCIRX": None if t == 0 else 250000 * (t % 5) + 512 * g,
            }
            row = "GPU {}".format(g).ljust(10)
            for name, width, _, is_double in DCGM_FIELDS:
                v = values[name]
                text = "N/A" if v is None else ("{:.3f}".format(v) if is_double else str(v))
                row += cell(text, width)
            out.append(row)
        if printed == 14:  # after the sleep, as LockWatchAndUpdate does
            out += [head, units]
            printed = 0
        printed += 1
    out += ["", "", "dmon was stopped do to receiving a signal"]  # sic, DCGM's text
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    for name, text in (("nvsmi_8gpu_100ms.csv", nvsmi()), ("dcgmi_4gpu_100ms.txt", dcgmi()),
                       ("nvsmi_3gpu_no_index.csv", nvsmi_no_index())):
        with open(os.path.join(HERE, name), "w", newline="\n") as f:
            f.write(text)
        print("wrote", name, text.count("\n"), "lines")
