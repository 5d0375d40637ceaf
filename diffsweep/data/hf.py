"""Hugging Face's offline mode: ``datasets`` and ``huggingface_hub`` fetch nothing inside ``offline()``.

Shared by the downstream probe (lm-eval loads its tasks' datasets) and ``data prepare`` (a
pretraining corpus named by its Hugging Face name): diffsweep never downloads at run time, so a
dataset must already be in the machine's Hugging Face cache.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator
from typing import Any

OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """Hugging Face's offline mode (no dataset or file is fetched), also where ``datasets`` and
    ``huggingface_hub`` were imported before (they read the variables at import). Both packages
    must be installed (the caller checks, to name its own extra)."""
    before_env = {name: os.environ.get(name) for name in OFFLINE_VARIABLES}
    os.environ.update(dict.fromkeys(OFFLINE_VARIABLES, "1"))
    datasets_config, hub_constants = _module("datasets.config"), _module("huggingface_hub.constants")
    patched = [(datasets_config, "HF_HUB_OFFLINE"), (datasets_config, "HF_DATASETS_OFFLINE"),
               (hub_constants, "HF_HUB_OFFLINE")]
    before = [getattr(module, name, None) for module, name in patched]
    for module, name in patched:
        setattr(module, name, True)
    try:
        yield
    finally:
        for (module, name), value in zip(patched, before, strict=True):
            setattr(module, name, value)
        for name, env in before_env.items():
            if env is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = env


def _module(name: str) -> Any:
    """A module imported now, typed ``Any`` (``datasets`` ships no complete type information)."""
    return importlib.import_module(name)
