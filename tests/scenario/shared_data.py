"""Test data taken from other repositories is not in the project's tree.

Holistic Trace Analysis's traces, Graphcore's length histograms and recorded nvidia-smi / dcgmi logs
live outside the repository, in $STALLBENCH_SHARED_DATA/{traces,data,telemetry}; by default
<source root>/../shared, the directory tests/meson.build passes to a test. A test whose data is absent
exits 77 (meson's SKIP) saying where the data is expected.

    directory(default, sub) -> $STALLBENCH_SHARED_DATA/sub when the variable is set, else default
    missing(paths)          -> why a test that reads `paths` is skipped ("" when all exist)
    WHERE                   -> where such data is read from, for a skip message
    SKIP                    -> 77
"""
import os

SKIP = 77
WHERE = ("third-party test data is not in the repository; it is read from $STALLBENCH_SHARED_DATA "
         "(default <source root>/../shared), see tests/data/README.md")


def directory(default, sub):
    root = os.environ.get("STALLBENCH_SHARED_DATA")
    return os.path.normpath(os.path.join(root, sub) if root else default)


def missing(paths):
    absent = [p for p in paths if not os.path.exists(p)]
    if not absent:
        return ""
    return f"{', '.join(absent)} absent: {WHERE}"
