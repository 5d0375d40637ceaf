"""Every Python process the test suite starts, with its CPU seconds: with this folder on
PYTHONPATH (an absolute path: tests start processes in other folders) and ``PROCPROF_FILE`` set,
each Python process appends one JSON line to that file as it exits: its first arguments, the
test that was running (``PYTEST_CURRENT_TEST``, which processes inherit) and its own CPU and wall
seconds. ``python3 analysis/benchmarks/procprof.py FILE`` sums them. Processes ended by
``os._exit`` or a signal they do not handle write nothing.
"""

import atexit
import json
import os
import resource
import sys
import time

_START = time.monotonic()


def _record() -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    line = {"argv": sys.argv[:4], "test": os.environ.get("PYTEST_CURRENT_TEST", ""),
            "cpu": usage.ru_utime + usage.ru_stime, "wall": time.monotonic() - _START}
    try:
        with open(os.environ["PROCPROF_FILE"], "a") as f:
            f.write(json.dumps(line) + "\n")
    except OSError:
        pass


if os.environ.get("PROCPROF_FILE"):
    atexit.register(_record)
