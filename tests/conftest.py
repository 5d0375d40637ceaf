"""Shared test set-up. Tests are CPU-first; GPU tests carry the ``gpu`` marker and skip themselves."""

from __future__ import annotations

import os
import shutil

# One thread per test process: the CI box has 2 cores and may be shared (see shared notes).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# Without a GPU, Triton kernels run in Triton's CPU interpreter; it must be switched on before
# any kernel module is imported. (Checked with nvidia-smi, not torch, to keep this import-free.)
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")
# One Triton config per kernel instead of the full autotune (hundreds of compiles, minutes on a
# GPU); tests/kernels/test_triton_diff.py checks every config on its own.
os.environ.setdefault("DIFFSWEEP_TRITON_AUTOTUNE", "first")

import time  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

# ``browser`` (one headless Chromium per session) and ``page``: defined once here, because two
# session-wide Playwright instances cannot run in one process.
from tests.browser import browser, page  # noqa: E402, F401
from tests.helpers.gpu import REQUIRE_GPU_ENV, require_cuda  # noqa: E402

# Tiny training runs for tests: tiny-xs on a 512-token BPE, 2 micro-batches of 2 x 32 tokens per step.
TINY_RUN = [
    "model.size=tiny-xs",
    "model.vocab_size=512",
    "train.seq_len=32",
    "train.batch_tokens=128",
    "train.micro_batch_size=2",
    "train.max_steps=12",
    "train.warmup_steps=2",
    "train.eval_every=4",
    "train.eval_tokens=256",
    "train.checkpoint_every=2",
    "train.keep_checkpoints=100",
    "train.log_every=1",
]


@pytest.fixture(scope="session")
def text_dataset(tmp_path_factory) -> Path:
    """A real-English dataset (CPython's pydoc topics, ~0.5 MB) tokenized with a 512-token BPE."""
    import pydoc_data.topics

    from diffsweep.config import TokenizerKind
    from diffsweep.data.prepare import Document, prepare

    root = tmp_path_factory.mktemp("text")
    source = root / "topics.txt"
    source.write_text("\n".join(pydoc_data.topics.topics.values()))
    docs = [Document(name, text, source) for name, text in sorted(pydoc_data.topics.topics.items())]
    prepare(docs, root / "dataset", TokenizerKind.BPE, vocab_size=512)
    return root / "dataset"


@pytest.fixture(scope="session")
def mlflow_store(tmp_path_factory, store_template) -> str:
    """One SQLite MLflow store for the session (a copy of ``store_template``); tests use their own
    experiments in it."""
    from diffsweep.tracking.store import ensure_experiment

    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    shutil.copyfile(store_template, path)
    uri = f"sqlite:///{path}"
    ensure_experiment(uri, "warm-up")
    return uri


@pytest.fixture
def cuda() -> str:
    """The CUDA device for a test that needs one: skips without it, fails instead under
    DIFFSWEEP_REQUIRE_GPU=1 (``needs_cuda`` in tests/helpers/gpu.py)."""
    require_cuda()
    return "cuda"


def pytest_configure(config):
    """Under ``.ci/run`` the machine's set-up (Slurm, Chromium, the kit's wheels) runs beside the
    Python install: wait until it has ended (``DIFFSWEEP_CI_SETUP``, the file that receives its
    exit status), before pytest-xdist starts its workers; stop the run if it failed."""
    status_file = os.environ.get("DIFFSWEEP_CI_SETUP")
    if not status_file or hasattr(config, "workerinput"):
        return
    status = Path(status_file)
    if not status.exists():
        print(f"waiting for the machine's set-up ({status.parent / 'log'})", flush=True)
        while not status.exists():  # .ci/run writes it once the set-up has ended, whatever its outcome
            time.sleep(0.5)
    if status.read_text().strip() != "0":
        raise pytest.UsageError(f"the machine's set-up failed (exit {status.read_text().strip()}): "
                                f"{status.parent / 'log'}")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Under DIFFSWEEP_REQUIRE_GPU=1 every test marked ``gpu`` needs CUDA, also those that would
    otherwise fall back to the CPU (Triton's interpreter): that run is the GPU validation."""
    if os.environ.get(REQUIRE_GPU_ENV) == "1" and item.get_closest_marker("gpu"):
        require_cuda()


@pytest.fixture(scope="session")
def store_template(tmp_path_factory) -> Path:
    """An empty SQLite MLflow store, its schema created once per test run (MLflow's migrations take
    1-4 s on the CI machine; a copy takes milliseconds). Under pytest-xdist the workers share it:
    the first to get the lock in their common base folder makes it; tests copy it, never write it."""
    from filelock import FileLock

    from diffsweep.tracking.store import init_store

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, above each worker's
    path = root / "store-template.db"
    with FileLock(str(root / "store-template.lock")):
        if not path.is_file():
            staging = root / f"store-template.{os.getpid()}.tmp"
            init_store(f"sqlite:///{staging}")
            staging.rename(path)
    return path


# The xdist group of every test that reads ``seeds_sweep``: one worker launches it.
SEEDS_SWEEP = pytest.mark.xdist_group("seeds_sweep")


@pytest.fixture(scope="session")
def seeds_sweep(tmp_path_factory, text_dataset, store_template) -> tuple[Path, Path, dict]:
    """(project folder, sweep file, environment of its store) after ``diffsweep launch --wait`` of a
    tiny sweep ``cmp`` with the local executor (run in this process, its 4 jobs in their own), into a
    copy of ``store_template``: tiny-xs Transformer and DIFF V1 (2 rows, grid order) x seeds 0 and 1,
    16 steps of 128 tokens, evaluated every 2 steps. Tests only read it, and are marked
    ``SEEDS_SWEEP`` (tests/cli/test_compare_cli.py compares its rows, tests/scaling/test_fit_cli.py
    fits its evaluations against tokens)."""
    from tests.helpers.cli import run
    from tests.launch.conftest import TINY_SET

    root = tmp_path_factory.mktemp("seeds-sweep")
    shutil.copyfile(store_template, root / "mlflow.db")  # migrated once per session
    settings = {**TINY_SET, "data.path": str(text_dataset), "train.max_steps": 16, "train.eval_every": 2,
                "train.checkpoint_every": 8}
    lines = ["name: cmp", "set:"] + [f"  {k}: {v}" for k, v in settings.items()]
    lines += ["grid:", "  model.attention.kind: [transformer, diff_v1]", "seeds: [0, 1]"]
    sweep = root / "t.yaml"
    sweep.write_text("\n".join(lines) + "\n")
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}"}
    r = run("launch", str(sweep), "--executor", "local", "--max-parallel", "2", "--wait", "--out", str(root / "runs"),
            cwd=root, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return root, sweep, env


@pytest.fixture
def store(tmp_path, store_template) -> dict:
    """Environment for a CLI process with its own SQLite MLflow store, ``tmp_path/mlflow.db``: a copy
    of the empty ``store_template`` (a test of how a store is created uses ``new_store``)."""
    shutil.copyfile(store_template, tmp_path / "mlflow.db")
    return {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}


@pytest.fixture
def new_store(tmp_path) -> dict:
    """Environment for a CLI process whose SQLite MLflow store, ``tmp_path/mlflow.db``, does not exist
    yet: the command creates it (or, refusing, must not)."""
    return {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}


@pytest.hookimpl(wrapper=True)  # marks them before any plain hook, pytest-xdist's included
def pytest_collection_modifyitems(config, items):
    """Under ``pytest -n N --dist loadgroup`` the tests marked ``slurm`` run one after another in
    one worker: the localhost cluster has 2 CPUs and 2 fake GPUs, and tests that wait for their own
    jobs must not queue behind another test's. pytest-xdist groups by a node-id suffix it adds in
    its own hook; pytest 9.2 made that a no-op (the tests then ran at once and timed out in CI), so
    pyproject.toml keeps pytest below 9.2 and this checks that the suffix is there."""
    for item in items:
        if item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.xdist_group("slurm"))
    result = yield
    if getattr(config.option, "loadgroup", False):
        lost = [item.nodeid for item in items if item.get_closest_marker("slurm") and not item.nodeid.endswith("@slurm")]
        if lost:
            raise pytest.UsageError(f"pytest-xdist did not put {lost[0]} (and {len(lost) - 1} more) in the 'slurm' "
                                    f"group (pytest {pytest.__version__}): they would run at once on one cluster")
    return result
