"""Profile checks that need no cluster: time limits against the preemption signal, command-line
overrides (--slurm, --setup), Slurm time strings and GRES strings."""

from __future__ import annotations

import dataclasses

import pytest

from diffsweep.cli.common import COMMON_FLAGS, rekeyed
from diffsweep.config import ConfigError, ConfigWarning
from diffsweep.launch.jobs.cluster import gpus_per_node
from diffsweep.launch.profile_choice import find_profile, load_profile, parse_profile, with_overrides
from diffsweep.launch.profiles import LOCAL, slurm_minutes
from tests.helpers.cli import run as cli

SLURM = {"executor": "slurm", "gpus_per_node": 2}


@pytest.mark.parametrize("fields, key, message", [
    # the case: USR2 180 s before the end of a 3-minute job
    ({"max_time_hours": 0.05, "min_time_minutes": 3, "signal_delay_s": 180}, "p.yaml: max_time_hours",
     ("3-minute jobs are too short for signal_delay_s 180: USR2 comes 180 s before the limit and up to 60 s earlier, "
     "so a job needs at least 6 minutes (the delay plus max(60 s, the delay)); make jobs longer or lower "
     "signal_delay_s")),
    ({"min_time_minutes": 1, "signal_delay_s": 30}, "p.yaml: min_time_minutes", "at least 2 minutes"),
    ({"max_time_hours": 0.01}, "p.yaml: max_time_hours",
     "expected at least one minute, got 0.6 minutes (Slurm reads a time limit of 0 as no limit)"),
])
def test_jobs_too_short_for_their_signal_or_under_a_minute_are_refused(fields, key, message):
    with pytest.raises(ConfigError) as caught:
        parse_profile({**SLURM, **fields}, "p.yaml", "p")
    assert caught.value.key == key and message in caught.value.message


def test_time_limits_that_leave_room_are_accepted():
    # 2-minute jobs with USR2 60 s before the end (test_slurm's time-limit test): 60 + max(60, 60) s
    p = parse_profile({**SLURM, "max_time_hours": 0.0334, "min_time_minutes": 2, "signal_delay_s": 60}, "p.yaml", "p")
    assert p.max_time_minutes == 2
    assert parse_profile({**SLURM, "max_time_hours": 2 / 60, "min_time_minutes": 2, "signal_delay_s": 60}, "p.yaml",
                         "p").max_time_minutes == 2  # not 1.999... -> 1
    parse_profile({"executor": "local", "min_time_minutes": 1, "signal_delay_s": 600}, "p.yaml", "p")  # no signal


def test_a_profile_with_a_bad_time_fails_plan_with_one_line_and_writes_nothing(tmp_path):
    (tmp_path / "p.yaml").write_text("executor: slurm\ngpus_per_node: 2\nmax_time_hours: 0.05\nmin_time_minutes: 3\n"
                                     "signal_delay_s: 180\n")
    (tmp_path / "t.yaml").write_text("grid: {model.size: [tiny-xs]}\n")
    for command in ("plan", "launch"):
        r = cli(command, "t.yaml", "--profile", "p.yaml", cwd=tmp_path)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith("error: p.yaml: max_time_hours: 3-minute jobs are too short"), r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yaml", "t.yaml"]


@pytest.mark.parametrize("text, minutes", [
    ("90", 90), ("1:30", 1.5), ("1:30:00", 90), ("2-0", 2880), ("1-12:30", 2190), ("1-0:0:30", 1440.5),
])
def test_slurm_time_strings(text, minutes):
    assert slurm_minutes(text, "slurm_overrides.time") == minutes


@pytest.mark.parametrize("text", ["abc", "1:2:3:4", "-5", "1h", ""])
def test_bad_slurm_time_strings(text):
    with pytest.raises(ConfigError, match=r"slurm_overrides.time: expected a Slurm time \(minutes, H:MM:SS or D-HH:MM:SS\)"):
        slurm_minutes(text, "slurm_overrides.time")


def test_command_line_overrides_of_a_profile():
    base = load_profile("localhost")
    p = with_overrides(base, ["account=proj", "qos=high", "partition=gpu", "time=3:00:00"], ["module load cuda"])
    assert p.executor_params == {"partition": "gpu", "account": "proj", "qos": "high"}
    assert p.max_time_minutes == 180 and p.setup == ("module load cuda",)
    assert p.param_key("account") == "slurm_overrides.account" and load_profile("localhost").param_key("partition") == \
        "profile localhost: executor_params.partition"
    assert with_overrides(base, None, None) is base


@pytest.mark.parametrize("slurm, setup, message", [
    (["partitoin=gpu"], None, ("--slurm partitoin: submitit's Slurm executor does not accept this parameter (did you "
                              "mean 'partition'?)")),
    (["nodes=2"], None, "--slurm nodes: is derived per run by diffsweep"),
    (["account"], None, "--slurm: expected KEY=VALUE (e.g. account=myproj, time=4:00:00), got 'account'"),
    (["account=a;b"], None, "--slurm account: value 'a;b' has characters that are not allowed"),
    (["time=1"], None, "--slurm time: 1-minute jobs are too short for signal_delay_s 30"),
])
def test_bad_overrides_name_the_option(slurm, setup, message):
    with pytest.raises(ConfigError) as caught:
        with_overrides(load_profile("localhost"), slurm, setup)
    assert caught.value.key.startswith("slurm_overrides"), caught.value.key  # the library names its field
    shown = str(rekeyed(caught.value, COMMON_FLAGS))  # the CLI names the flag
    assert shown.startswith(message), shown


def test_the_command_line_names_the_flag_and_the_sweep_file_its_key(tmp_path):
    (tmp_path / "t.yaml").write_text("grid: {model.size: [tiny-xs]}\n")
    (tmp_path / "d.yaml").write_text("launch: {profile: nosuch}\ngrid: {model.size: [tiny-xs]}\n")
    for args, line in [
        (["t.yaml", "--profile", "localhost", "--slurm", "time=1"], "error: --slurm time: 1-minute jobs are too short"),
        (["t.yaml", "--profile", "localhost", "--slurm", "nodes=2"], "error: --slurm nodes: is derived per run"),
        (["t.yaml", "--profile", "nosuch"], "error: --profile: unknown profile 'nosuch'; expected one of ["),
        (["t.yaml", "--profile", "localhost", "--set", "model.sise=tiny-m"], "error: --set: model.sise: unknown config"),
        (["d.yaml"], "error: d.yaml: launch.profile: unknown profile 'nosuch'"),
    ]:
        r = cli("plan", *args, cwd=tmp_path)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith(line), (args, r.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.yaml", "t.yaml"]


def test_overrides_need_a_slurm_profile():
    with pytest.raises(ConfigError, match=r"^setup_lines: profile local runs jobs on this machine"):
        with_overrides(LOCAL, None, ["module load cuda"])


@pytest.mark.parametrize("gres, gpus", [
    ("gpu:2", 2), ("gpu:h100:8(S:0-1)", 8), ("gpu:a100:4,gpu:v100:2", 6), ("(null)", 0), ("gpu:4(S:0,1)", 4),
    ("shard:8,gpu:2", 2), ("gpu:tesla:2(S:0),mps:100", 2),
])
def test_gpus_per_node_from_sinfo_gres(gres, gpus):
    assert gpus_per_node(gres) == gpus


def test_a_profile_that_says_slurm_for_executor_params_is_read_with_a_warning(tmp_path):
    """``slurm:`` is what ``executor_params:`` was called: such a profile still loads, the same, and
    says what to rename; a profile with both is refused."""
    new = load_profile("localhost")
    old = tmp_path / "old.yaml"
    old.write_text(find_profile("localhost").read_text().replace("executor_params:", "slurm:"))
    with pytest.warns(ConfigWarning, match=rf"{old}: slurm: is the old name of executor_params; rename it"):
        read = load_profile(str(old))
    assert dataclasses.replace(read, name=new.name) == new
    both = tmp_path / "both.yaml"
    both.write_text(old.read_text() + "executor_params: {partition: debug}\n")
    with pytest.raises(ConfigError, match=rf"{both}: slurm: is the old name of executor_params, which this profile "
                                          "sets too"):
        load_profile(str(both))
