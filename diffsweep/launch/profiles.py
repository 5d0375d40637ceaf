"""Cluster profiles: what a cluster offers (GPU kind, GPUs per node, limits, partition, account,
setup commands) as YAML under ``slurm/profiles/``. Resources per run are derived from its size
(``diffsweep.launch.resources``); a profile never fixes them per run.

A profile file::

    executor: slurm                 # slurm | local
    gpu: {name: H100, memory_gb: 80, peak_tflops: 989, mfu: 0.40}
    gpus_per_node: 8
    cpus_per_gpu: 16
    mem_per_gpu_gb: 200
    max_time_hours: 48              # partition limit; longer runs requeue from their checkpoint
    min_time_minutes: 30
    signal_delay_s: 120             # USR2 this long before the time limit (save + requeue)
    max_array_size: null            # null: ask the cluster (scontrol show config)
    max_num_timeout: 100            # requeues after time limits before a run counts as failed
    setup: ["module load cuda/12.4"]   # shell lines before the job starts (yours, run as written)
    slurm: {partition: gpu, account: myproj, constraint: h100, qos: normal}   # passed to submitit
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from diffsweep.config import ConfigError
from diffsweep.config.loading import read_yaml


class ExecutorKind(StrEnum):
    """Where jobs run."""

    SLURM = "slurm"  # sbatch job arrays through submitit
    LOCAL = "local"  # processes on this machine through submitit's local executor


@dataclass(frozen=True, kw_only=True)
class Accelerator:
    """The device a job trains on, for time estimates (FLOPs / (peak x MFU))."""

    name: str = "cpu"
    memory_gb: float = 16.0
    peak_tflops: float = 0.2  # dense bf16 (GPU) or fp32 (CPU) peak
    mfu: float = 0.3  # assumed model FLOPs utilisation


@dataclass(frozen=True, kw_only=True)
class Profile:
    """A cluster (or this machine) as the launcher sees it."""

    name: str = "local"
    executor: ExecutorKind = ExecutorKind.LOCAL
    gpu: Accelerator = field(default_factory=Accelerator)
    gpus_per_node: int = 0  # 0: CPU-only (local executor)
    cpus_per_gpu: int = 8
    mem_per_gpu_gb: int = 64
    max_time_hours: float = 48.0
    min_time_minutes: int = 30
    signal_delay_s: int = 120
    max_array_size: int | None = None
    max_num_timeout: int = 100
    setup: tuple[str, ...] = ()
    slurm: dict[str, Any] = field(default_factory=dict)


LOCAL = Profile()  # the embedded default: this machine, no cluster

# Derived per run by diffsweep (resources, job name, arrays); a profile must not set them.
DERIVED_SLURM_KEYS = frozenset({
    "nodes", "gpus_per_node", "ntasks_per_node", "tasks_per_node", "cpus_per_task", "cpus_per_gpu", "mem",
    "mem_per_gpu", "mem_per_cpu", "time", "timeout_min", "job_name", "array_parallelism", "signal_delay_s",
    "setup", "map_count", "folder", "command", "num_gpus", "gpus_per_task", "gres", "array",
})
_SAFE_SLURM_VALUE = re.compile(r"^[A-Za-z0-9_.,:=@%+/\-\[\] ]*$")


def profile_dirs() -> list[Path]:
    """Where profile names are looked up: $DIFFSWEEP_PROFILES, ./slurm/profiles, the repo's."""
    dirs = [Path(p) for p in os.environ.get("DIFFSWEEP_PROFILES", "").split(os.pathsep) if p]
    dirs += [Path.cwd() / "slurm" / "profiles", Path(__file__).resolve().parents[2] / "slurm" / "profiles"]
    return dirs


def find_profile(name_or_path: str) -> Path:
    """The YAML file of a profile name (``localhost``) or path (``my/profile.yaml``)."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        if not path.is_file():
            raise ConfigError("--profile", f"profile file {path} not found")
        return path
    for d in profile_dirs():
        candidate = d / f"{name_or_path}.yaml"
        if candidate.is_file():
            return candidate
    known = sorted({p.stem for d in profile_dirs() if d.is_dir() for p in d.glob("*.yaml")} | {"local"})
    raise ConfigError("--profile", f"unknown profile {name_or_path!r}; expected one of [{', '.join(known)}] "
                      "or a path to a profile YAML")


def load_profile(name_or_path: str | None) -> Profile:
    """Load a profile by name or path; ``local`` (or None) is the embedded default."""
    if name_or_path in (None, "local"):
        return LOCAL
    path = find_profile(name_or_path)
    return parse_profile(read_yaml(path), str(path), name=path.stem)


def parse_profile(raw: dict[str, Any], where: str, name: str) -> Profile:
    """Strictly decode a profile mapping; errors name ``where`` and the key."""
    allowed = [f.name for f in dataclasses.fields(Profile) if f.name != "name"]
    values: dict[str, Any] = {"name": name}
    for key, value in raw.items():
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{where}: {key}", f"unknown profile key{hint}; expected one of [{', '.join(allowed)}]")
        values[key] = value
    try:
        executor = ExecutorKind(values.get("executor", "slurm"))
    except ValueError:
        raise ConfigError(f"{where}: executor", f"expected one of [{', '.join(e.value for e in ExecutorKind)}], "
                          f"got {values['executor']!r}") from None
    values["executor"] = executor
    values["gpu"] = _accelerator(values.get("gpu"), f"{where}: gpu")
    for key in ("gpus_per_node", "cpus_per_gpu", "mem_per_gpu_gb", "min_time_minutes", "signal_delay_s",
                "max_num_timeout"):
        if key in values:
            _int(values[key], f"{where}: {key}", minimum=0 if key == "gpus_per_node" else 1)
    if "max_array_size" in values and values["max_array_size"] is not None:
        _int(values["max_array_size"], f"{where}: max_array_size", minimum=1)
    if "max_time_hours" in values:
        v = values["max_time_hours"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise ConfigError(f"{where}: max_time_hours", f"expected a positive number, got {v!r}")
    setup = values.get("setup", [])
    if not isinstance(setup, list) or any(not isinstance(s, str) for s in setup):
        raise ConfigError(f"{where}: setup", f"expected a list of shell lines, got {setup!r}")
    values["setup"] = tuple(setup)
    values["slurm"] = check_slurm_params(values.get("slurm") or {}, f"{where}: slurm")
    return Profile(**values)


def check_slurm_params(params: Any, where: str) -> dict[str, Any]:
    """Profile ``slurm:`` keys must be parameters submitit's SlurmExecutor accepts, not ones
    diffsweep derives, and their values must be plain (they become ``#SBATCH`` lines)."""
    if not isinstance(params, dict):
        raise ConfigError(where, f"expected a mapping of submitit Slurm parameters, got {params!r}")
    valid = slurm_parameter_names()
    for key, value in params.items():
        if key in DERIVED_SLURM_KEYS:
            raise ConfigError(f"{where}.{key}", "is derived per run by diffsweep (from the size and the profile's "
                              "gpus_per_node, cpus_per_gpu, mem_per_gpu_gb, max_time_hours); remove it")
        if key not in valid:
            close = difflib.get_close_matches(str(key), sorted(valid), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{where}.{key}", f"submitit's Slurm executor does not accept this parameter{hint}")
        for item in (value.items() if isinstance(value, dict) else [(None, value)]):
            for text in item:
                if text is not None and not _SAFE_SLURM_VALUE.match(str(text)):
                    raise ConfigError(f"{where}.{key}", f"value {text!r} has characters that are not allowed in an "
                                      "#SBATCH line (quotes, shell metacharacters, newlines)")
    return dict(params)


def slurm_parameter_names() -> frozenset[str]:
    """Parameters of submitit's SlurmExecutor (read from submitit itself)."""
    import submitit

    return frozenset(submitit.SlurmExecutor._valid_parameters())


def _accelerator(raw: Any, where: str) -> Accelerator:
    if raw is None:
        return Accelerator()
    if not isinstance(raw, dict):
        raise ConfigError(where, f"expected a mapping (name, memory_gb, peak_tflops, mfu), got {raw!r}")
    allowed = [f.name for f in dataclasses.fields(Accelerator)]
    for key, value in raw.items():
        if key not in allowed:
            raise ConfigError(f"{where}.{key}", f"unknown key; expected one of [{', '.join(allowed)}]")
        if key != "name" and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise ConfigError(f"{where}.{key}", f"expected a positive number, got {value!r}")
    if "mfu" in raw and raw["mfu"] > 1:
        raise ConfigError(f"{where}.mfu", f"expected a fraction in (0, 1], got {raw['mfu']!r}")
    return Accelerator(**raw)


def _int(value: Any, where: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(where, f"expected an integer >= {minimum}, got {value!r}")
