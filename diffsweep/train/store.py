"""Moved to ``diffsweep.store`` (the store sits below train/, so launch/ and scaling/ use it
without importing the trainer). These names stay importable from here for code not yet moved
(diffsweep/cli/ui.py, tests/conftest.py, tests/test_readme_examples.py, analysis/benchmarks);
import them from ``diffsweep.store``."""

from diffsweep.store import (  # noqa: F401  (re-exported)
    BUSY_SECONDS,
    CONNECT_TIMEOUT,
    KEY,
    busy,
    check_tracking,
    ensure_experiment,
    existing_store,
    fail_fast_http,
    init_store,
    retry_busy,
    shown,
    tracking_uri,
)
