"""Finding, loading, checking and choosing a profile (``diffsweep.launch.profiles`` says what one
holds): a name or a YAML path is read strictly, its ``executor_params`` checked against what its
scheduler's submitit executor accepts, its job times against the time-limit signal; ``--profile``,
``--executor``, ``--slurm KEY=VALUE``, ``--setup LINE`` and a sweep's ``launch.profile`` pick and
adjust the one a command uses. See docs/sweeps.md, 'Profiles and resources'.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import warnings
from pathlib import Path
from typing import Any

from diffsweep.config import ConfigError, ConfigWarning
from diffsweep.config.decode import decode, did_you_mean
from diffsweep.config.loading import read_yaml
from diffsweep.launch.profiles import FILE_EXECUTOR, LOCAL, OLD_PARAMS_KEY, Profile, slurm_minutes
from diffsweep.launch.scheduler import detect_scheduler, get_scheduler
from diffsweep.sweep import SweepSpec

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


def pick_profile(profile: str | None, executor: str | None, declared: Profile | None = None) -> Profile:
    """``--profile`` > ``declared`` (a sweep's ``launch.profile``; unless ``--executor`` names a
    scheduler that may replace it, e.g. ``local``) > ``--executor``'s default profile > the automatic
    choice: the default profile of the scheduler that answers here (Slurm if a controller answers,
    else this machine). ``--executor`` must agree with an explicit ``--profile``."""
    named = get_scheduler(executor) if executor is not None else None  # an unknown name lists the known ones
    if profile is not None:
        chosen = load_profile(profile)
    elif declared is not None and not (named is not None and named.replaces_declared_profile
                                       and declared.executor != named.name):
        chosen = declared
    else:
        chosen = (named or detect_scheduler()).default_profile()
    if named is not None and chosen.executor != named.name:
        raise ConfigError("executor", f"{executor} disagrees with profile {chosen.name!r} "
                          f"(executor: {chosen.executor}); pick a {executor} profile with --profile")
    return chosen


def choose_profile(spec: SweepSpec, profile: str | None, executor: str | None) -> Profile:
    """``pick_profile`` for a sweep: its ``launch.profile`` is the declared one, always checked (a
    missing or unknown one is the sweep file's error, not the command line's)."""
    if executor is not None:
        get_scheduler(executor)  # an unknown name lists the known ones (before the sweep's profile is read)
    try:
        declared = load_profile(spec.launch.profile) if spec.launch.profile is not None else None
    except ConfigError as exc:
        raise ConfigError(f"{spec.path}: launch.profile" if exc.key == "profile" else exc.key, exc.message) from None
    return pick_profile(profile, executor, declared)


def find_profile(name_or_path: str) -> Path:
    """The YAML file of a profile name (``localhost``) or path (``my/profile.yaml``)."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        if not path.is_file():
            raise ConfigError("profile", f"profile file {path} not found")
        return path
    for d in profile_dirs():
        candidate = d / f"{name_or_path}.yaml"
        if candidate.is_file():
            return candidate
    known = sorted({p.stem for d in profile_dirs() if d.is_dir() for p in d.glob("*.yaml")} | {"local"})
    raise ConfigError("profile", f"unknown profile {name_or_path!r}; expected one of [{', '.join(known)}] "
                      "or a path to a profile YAML")


def load_profile(name_or_path: str | None) -> Profile:
    """Load a profile by name or path; ``local`` (or None) is the embedded default."""
    if name_or_path in (None, "local"):
        return LOCAL
    path = find_profile(name_or_path)
    return parse_profile(read_yaml(path), str(path), name=path.stem)


def parse_profile(raw: dict[str, Any], where: str, name: str) -> Profile:
    """Strictly decode a profile mapping; errors name ``where`` and the key."""
    if isinstance(raw, dict):  # a profile file is a cluster's unless it names another executor
        raw = {"executor": FILE_EXECUTOR, **_renamed(raw, where)}
    profile = decode(Profile, raw, source=where, noun="profile key")
    executor = get_scheduler(profile.executor, f"{where}: executor").name  # the one list of names
    params = check_executor_params(profile.executor_params or {}, f"{where}: executor_params",
                                   executor=executor)
    profile = dataclasses.replace(profile, name=name, executor=executor, executor_params=params)
    check_times(profile, where)
    return profile


def _renamed(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """``raw`` with its ``slurm:`` (the old name of ``executor_params:``) renamed, with a warning;
    both at once is an error."""
    if OLD_PARAMS_KEY not in raw:
        return raw
    if "executor_params" in raw:
        raise ConfigError(f"{where}: {OLD_PARAMS_KEY}", "is the old name of executor_params, which this profile "
                          "sets too; merge them into executor_params")
    warnings.warn(ConfigWarning(f"{where}: {OLD_PARAMS_KEY}: is the old name of executor_params; rename it "
                                "(the same keys)"), stacklevel=3)
    return {("executor_params" if k == OLD_PARAMS_KEY else k): v for k, v in raw.items()}


def check_executor_params(params: Any, where: str, sep: str = ".", executor: str = FILE_EXECUTOR
                          ) -> dict[str, Any]:
    """Profile ``executor_params:`` keys must be parameters the scheduler's submitit executor accepts
    (``Scheduler.parameter_names``), not ones diffsweep derives, and their values must be plain
    (they become ``#SBATCH`` lines). Errors name ``where``, ``sep`` and the key. A scheduler that
    takes no settings (local) ignores them, with a warning."""
    if not isinstance(params, dict):
        raise ConfigError(where, f"expected a mapping of submitit Slurm parameters, got {params!r}")
    valid = get_scheduler(executor).parameter_names()
    if valid is None:
        if params:
            warnings.warn(ConfigWarning(f"{where}: ignored; executor {executor} takes no job settings"), stacklevel=2)
        return dict(params)
    for key, value in params.items():
        if key in DERIVED_SLURM_KEYS:
            raise ConfigError(f"{where}{sep}{key}", "is derived per run by diffsweep (from the size and the "
                              "profile's gpus_per_node, cpus_per_gpu, mem_per_gpu_gb, max_time_hours); remove it")
        if key not in valid:
            raise ConfigError(f"{where}{sep}{key}", "submitit's Slurm executor does not accept this "
                              f"parameter{did_you_mean(str(key), valid)}")
        for item in (value.items() if isinstance(value, dict) else [(None, value)]):
            for text in item:
                if text is not None and not _SAFE_SLURM_VALUE.match(str(text)):
                    raise ConfigError(f"{where}{sep}{key}", f"value {text!r} has characters that are not allowed in "
                                      "an #SBATCH line (quotes, shell metacharacters, newlines)")
    return dict(params)


# Slurm sends the time-limit signal up to this much earlier than asked (sbatch(1), --signal:
# "due to the resolution of event handling by Slurm, the signal may be sent up to 60 seconds
# earlier than specified"; 32-49 s early measured on the test cluster).
SIGNAL_SLACK_S = 60


def check_times(profile: Profile, where: str) -> None:
    """A job must outlive its time-limit signal. USR2 comes ``signal_delay_s`` before the limit
    and up to a minute earlier, so every job (at least ``min_time_minutes``, at most
    ``max_time_hours``) must last the delay plus max(60 s, the delay): the slack keeps the signal
    from being due as the job starts, and a job then trains at least as long as it keeps for
    saving, instead of requeueing every few seconds. Slurm reads ``--time=0`` as no limit, so a
    job is never shorter than a minute."""
    key = "slurm_overrides.time" if "time" in profile.overridden else f"{where}: max_time_hours"
    if profile.max_time_minutes < 1:
        raise ConfigError(key, f"expected at least one minute, got {profile.max_time_hours * 60:g} minutes (Slurm "
                          "reads a time limit of 0 as no limit)")
    if not get_scheduler(profile.executor).time_limit_signal:
        return
    shortest = min(profile.min_time_minutes, profile.max_time_minutes)
    needed_s = profile.signal_delay_s + max(SIGNAL_SLACK_S, profile.signal_delay_s)
    if shortest * 60 < needed_s:
        if profile.min_time_minutes < profile.max_time_minutes:
            key = f"{where}: min_time_minutes"
        raise ConfigError(key, f"{shortest}-minute jobs are too short for signal_delay_s {profile.signal_delay_s}: "
                          f"USR2 comes {profile.signal_delay_s} s before the limit and up to {SIGNAL_SLACK_S} s "
                          f"earlier, so a job needs at least {math.ceil(needed_s / 60)} minutes (the delay plus "
                          "max(60 s, the delay)); make jobs longer or lower signal_delay_s")


def with_overrides(profile: Profile, slurm_overrides: list[str] | None, setup_lines: list[str] | None) -> Profile:
    """``profile`` with ``slurm_overrides`` ``KEY=VALUE`` (a ``slurm:`` key, checked as in a profile,
    or ``time``: the longest job, in Slurm's time format; the CLI's ``--slurm``) and ``setup_lines``
    (run after the profile's setup lines; the CLI's ``--setup``)."""
    slurm, setup = slurm_overrides, setup_lines
    if not slurm and not setup:
        return profile
    if get_scheduler(profile.executor).parameter_names() is None:
        raise ConfigError("slurm_overrides" if slurm else "setup_lines", f"profile {profile.name} runs jobs "
                          f"{get_scheduler(profile.executor).runs_jobs} (executor: {profile.executor}), which takes "
                          "no Slurm settings; pick a Slurm profile")
    params, max_hours, cli_keys = {}, profile.max_time_hours, set()
    for item in slurm or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ConfigError("slurm_overrides", f"expected KEY=VALUE (e.g. account=myproj, time=4:00:00), got {item!r}")
        key, value = key.strip(), value.strip()
        cli_keys.add(key)
        if key == "time":
            max_hours = slurm_minutes(value, "slurm_overrides.time") / 60
        else:
            params[key] = value
    params = check_executor_params(params, "slurm_overrides", executor=profile.executor)
    changed = dataclasses.replace(profile, executor_params={**profile.executor_params, **params}, max_time_hours=max_hours,
                                  setup=(*profile.setup, *(setup or [])), overridden=profile.overridden | cli_keys)
    check_times(changed, f"profile {profile.name}")
    return changed
