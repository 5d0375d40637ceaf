"""Cluster profiles: what a cluster offers (GPU kind, GPUs per node, limits, partition, account,
setup commands) as YAML under ``slurm/profiles/`` (``Profile``'s docstring shows a file). Resources
per run are derived from its size (``diffsweep.launch.resources``); a profile never fixes them per run.
Reading, checking and choosing one is ``diffsweep.launch.profile_choice``. See docs/sweeps.md,
'Profiles and resources'.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Annotated, Any

from diffsweep.config import ConfigError
from diffsweep.config.decode import INTERNAL, AtLeast, Check, Described, positive_number

# ``Profile.executor`` is a registered scheduler's name (``diffsweep.launch.scheduler``: the one list
# of them; ``profile_choice.parse_profile`` checks it). A profile file that names none is a cluster's; a profile made in code runs here.
FILE_EXECUTOR = "slurm"
DEFAULT_EXECUTOR = "local"
OLD_PARAMS_KEY = "slurm"  # what executor_params was called (still read, with a warning)


def _finite(value: Any, key: str) -> Any:
    """A positive, finite number (``positive_number`` lets ``.inf`` through: an infinite memory,
    peak or time limit cannot size a job)."""
    value = positive_number(value, key)
    if not value < math.inf:
        raise ConfigError(key, f"expected a positive finite number, got {value!r}")
    return value


def _fraction(value: Any, key: str) -> Any:
    value = _finite(value, key)
    if value > 1:
        raise ConfigError(key, f"expected a fraction in (0, 1], got {value!r}")
    return value


def _shell_lines(value: Any, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or any(not isinstance(s, str) for s in value):
        raise ConfigError(key, f"expected a list of shell lines, got {value!r}")
    return tuple(value)


def _checked_with_the_executor(value: Any, key: str) -> Any:
    return value  # ``executor_params:`` depends on the executor: ``parse_profile`` checks it once both are read


@dataclass(frozen=True, kw_only=True)
class Accelerator:
    """The device a job trains on, for time estimates (FLOPs / (peak x MFU))."""

    name: str = "cpu"
    memory_gb: Annotated[float, Check(_finite)] = 16.0
    peak_tflops: Annotated[float, Check(_finite)] = 0.2  # dense bf16 (GPU) or fp32 (CPU) peak
    mfu: Annotated[float, Check(_fraction)] = 0.3  # assumed model FLOPs utilisation


@dataclass(frozen=True, kw_only=True)
class CpuJobs:
    """What a CPU-only job asks for (a ``data prepare --launch`` task: one tokenizing process)."""

    cpus: Annotated[int, AtLeast(1)] = 1  # a Slurm task tokenizes its shards in as many processes as it has CPUs
    mem_gb: Annotated[int, AtLeast(1)] = 8
    time_hours: Annotated[float, Check(_finite)] | None = None  # None: the profile's max_time_hours


@dataclass(frozen=True, kw_only=True)
class Profile:
    """A cluster (or this machine) as the launcher sees it. A profile file sets every field but
    ``name`` (the file's stem) and ``overridden`` (``profile_choice.parse_profile``)::

        executor: slurm                 # the scheduler: slurm | local | one a package registers
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
        executor_params: {partition: gpu, account: myproj, constraint: h100, qos: normal}   # to submitit
        cpu_jobs: {cpus: 1, mem_gb: 8, time_hours: 4}   # CPU-only jobs: `data prepare --launch` tasks
    """

    name: Annotated[str, INTERNAL] = "local"
    # the scheduler's name (diffsweep.launch.scheduler); a profile file that names none is slurm
    executor: str = DEFAULT_EXECUTOR  # checked against the schedulers' registry when a profile is read
    gpu: Annotated[Accelerator, Described("a mapping (name, memory_gb, peak_tflops, mfu)")] = field(
        default_factory=Accelerator)
    gpus_per_node: Annotated[int, AtLeast(0)] = 0  # 0: CPU-only (local executor)
    cpus_per_gpu: Annotated[int, AtLeast(1)] = 8
    mem_per_gpu_gb: Annotated[int, AtLeast(1)] = 64
    max_time_hours: Annotated[float, Check(_finite)] = 48.0
    min_time_minutes: Annotated[int, AtLeast(1)] = 30
    signal_delay_s: Annotated[int, AtLeast(1)] = 120
    max_array_size: Annotated[int, AtLeast(1)] | None = None
    max_num_timeout: Annotated[int, AtLeast(1)] = 100
    setup: Annotated[tuple[str, ...], Check(_shell_lines)] = ()
    # the scheduler's own settings (its submitit executor's parameters); ``slurm:`` is its old name
    executor_params: Annotated[dict[str, Any], Check(_checked_with_the_executor)] = field(default_factory=dict)
    cpu_jobs: Annotated[CpuJobs, Described("a mapping (cpus, mem_gb, time_hours)")] = field(default_factory=CpuJobs)
    overridden: Annotated[frozenset[str], INTERNAL] = frozenset()  # keys set with --slurm (errors name them so)

    @property
    def max_time_minutes(self) -> int:
        """The longest job in whole minutes (Slurm's ``--time``), as ``max_time_hours`` allows."""
        return math.floor(self.max_time_hours * 60 + 1e-6)  # 1e-6: 2/60 h is 2 minutes, not 1.99...

    def param_key(self, name: str) -> str:
        """How an error names the ``executor_params:`` key ``name``: as ``slurm_overrides.NAME`` (the
        CLI's ``--slurm NAME``) if the command line set it."""
        return (f"slurm_overrides.{name}" if name in self.overridden
                else f"profile {self.name}: executor_params.{name}")


LOCAL = Profile()  # the embedded default: this machine, no cluster

_SLURM_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def slurm_minutes(text: str, where: str) -> float:
    """Minutes of a Slurm time (sbatch ``--time``): ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``."""
    m = _SLURM_TIME.match(text)
    if m is None:
        raise ConfigError(where, f"expected a Slurm time (minutes, H:MM:SS or D-HH:MM:SS), got {text!r}")
    days, a, b, c = (int(g) if g is not None else None for g in m.groups())
    first = int(m.group(2))  # the one number every spelling has
    if days is not None:  # D-H, D-H:M, D-H:M:S
        hours, minutes, seconds = first, b or 0, c or 0
    elif c is not None:  # H:M:S
        hours, minutes, seconds = first, b or 0, c
    else:  # M or M:S
        hours, minutes, seconds = 0, first, b or 0
    return (days or 0) * 1440 + hours * 60 + minutes + seconds / 60
