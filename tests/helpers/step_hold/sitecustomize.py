"""Imported at start-up by the Python processes of a test that puts this folder on PYTHONPATH and
sets ``DIFFSWEEP_TEST_HOLD`` to ``STEP:FOLDER`` (``tests.helpers.held.StepHold``): a training process
that reaches step STEP (after its checkpoint and its other callbacks, before it looks for a signal;
step 0: as ``train`` is called, before the run sets up and its signal handlers are up) writes
``FOLDER/held-<pid>`` and waits there until ``FOLDER/go`` (or its own ``FOLDER/go-<pid>``) exists. A signal sent meanwhile is
handled in the wait (a preemption signal sets the trainer's flag, which the loop reads right after;
SIGINT raises there), so it lands at that step whatever the machine's speed; the trainer's
preemption handler writes ``FOLDER/signalled-<pid>`` once it has run, so a test knows when to let
the process go even where the signal comes from elsewhere (Slurm's scancel).

The modules are patched as they are imported (nothing is imported here before the process would
import it): ``train`` gets the holding callback, whoever calls it (the CLI, a launched job, each
process of a torchrun)."""

import os

if os.environ.get("DIFFSWEEP_TEST_HOLD"):
    import importlib.abc
    import importlib.machinery
    import sys
    import time

    _STEP, _FOLDER = os.environ["DIFFSWEEP_TEST_HOLD"].split(":", 1)
    _MAX_WAIT = 900.0  # longer than any test waits for a held process (600 s at most)

    def _mark(name, text):
        with open(os.path.join(_FOLDER, f"{name}-{os.getpid()}"), "w") as f:
            f.write(text)

    def _hold(step, metrics=None):
        if step == int(_STEP):
            _mark("held", str(step))
            go = (os.path.join(_FOLDER, "go"), os.path.join(_FOLDER, f"go-{os.getpid()}"))
            deadline = time.monotonic() + _MAX_WAIT
            while not any(map(os.path.exists, go)):
                if time.monotonic() > deadline:  # its test failed before letting it go: do not outlive it for ever
                    print(f"step_hold: not let go within {_MAX_WAIT:g} s; going on", file=sys.stderr, flush=True)
                    break
                time.sleep(0.01)

    def _patch_trainer(trainer):
        real = trainer.train

        def train(*args, callbacks=(), **kwargs):
            _hold(0)
            return real(*args, callbacks=(*callbacks, _hold), **kwargs)

        trainer.train = train

    def _patch_preemption(preemption):
        handle = preemption.PreemptionFlag._handle

        def _handle(self, signum, frame):
            handle(self, signum, frame)
            _mark("signalled", str(signum))

        preemption.PreemptionFlag._handle = _handle

    _PATCHES = {"diffsweep.train.trainer": _patch_trainer, "diffsweep.train.preemption": _patch_preemption}

    class _PatchOnImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name not in _PATCHES:
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            exec_module = spec.loader.exec_module

            def exec_and_patch(module):
                exec_module(module)
                _PATCHES[name](module)

            spec.loader.exec_module = exec_and_patch
            return spec

    sys.meta_path.insert(0, _PatchOnImport())


def _chain() -> None:
    """Run the ``sitecustomize`` that this one shadows (the next on ``sys.path``), as Python would have
    without it: e.g. ``analysis/benchmarks/procprof_site``'s, which records each process's CPU."""
    import importlib.util
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        path = os.path.join(entry or ".", "sitecustomize.py")
        if os.path.abspath(entry or ".") != here and os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", path)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


_chain()
