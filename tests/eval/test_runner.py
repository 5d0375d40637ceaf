"""``diffsweep eval`` on a trained run: the checkpoint loads as trained, each probe becomes an MLflow
run nested under the training run, a repeated evaluation is skipped, bad input is one line."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from diffsweep.config import ConfigError
from diffsweep.data.dataset import val_starts, windows
from diffsweep.eval.loading import find_checkpoint, load_trained
from diffsweep.eval.probe import Probe, ProbeResult, get_probe, parse_settings, probe_requests
from diffsweep.eval.runner import evaluate
from diffsweep.train.probes import token_losses
from tests.helpers.cli import run as cli
from tests.helpers.tracking import mlflow_client

# One worker runs these and tests/eval/test_downstream.py: the session's trained run is trained once.
pytestmark = pytest.mark.xdist_group("trained_run")


@dataclass(frozen=True)
class LossSettings:
    tokens: int = 256


class ValLoss(Probe):
    """A real probe for these tests: validation loss over the first ``tokens`` validation tokens."""

    name = "val_loss_test"
    summary = "validation loss"
    cites = "-"
    Settings = LossSettings
    headline = "test/val_loss"

    def run(self, ctx, settings):
        starts = val_starts(len(ctx.val_tokens), ctx.config.train.seq_len, settings.tokens)
        window = torch.from_numpy(windows(ctx.val_tokens, starts, ctx.config.train.seq_len))
        with torch.no_grad():
            loss = float(token_losses(ctx.model, window).double().mean())
        (ctx.out_dir / "loss.txt").write_text(f"{loss}\n")
        return ProbeResult(metrics={"test/val_loss": loss}, series={"test/curve": {1: 1.0, 2: 0.5}},
                           tables={"loss": [{"tokens": settings.tokens, "loss": loss}]},
                           files=[ctx.out_dir / "loss.txt"], notes=["a note"])


def test_the_checkpoint_loads_as_trained(trained_run, mlflow_store):
    """The loaded model's validation loss over the trainer's validation windows is the one the
    trainer logged at the last step (eval_tokens 256 of seq_len 128, micro-batches of 2)."""
    trained = load_trained(trained_run)
    assert trained.step == 12 and trained.checkpoint.name == "step_00000012"
    assert trained.config.model.attention.kind == "diff_v1" and not trained.model.training
    logged = mlflow_client(mlflow_store).get_metric_history(trained.mlflow_run_id, "val/loss")
    last = next(m.value for m in logged if m.step == 12)
    val = trained.dataset.split("val")
    starts = val_starts(len(val), 128, 256)
    total = sum(float(token_losses(trained.model, torch.from_numpy(windows(val, starts[i:i + 2], 128))).double().sum())
                for i in range(0, len(starts), 2))
    assert total / (len(starts) * 128) == pytest.approx(last, rel=1e-6)
    earlier = load_trained(trained_run / "checkpoints" / "step_00000004")
    assert earlier.step == 4 and earlier.run_dir == trained_run.absolute()
    assert not torch.equal(earlier.model.output_weight(), trained.model.output_weight())


def test_evaluations_are_runs_nested_under_the_training_run_and_are_not_repeated(trained_run, mlflow_store):
    trained = load_trained(trained_run / "checkpoints" / "step_00000008")
    probe = ValLoss()
    lines: list[str] = []
    first = evaluate(trained, [(probe, parse_settings(probe, {"tokens": 128}))], uri=mlflow_store, echo=lines.append)
    (e,) = first
    assert e.ran and e.step == 8 and e.result.metrics["test/val_loss"] > 0
    client = mlflow_client(mlflow_store)
    run = client.get_run(e.mlflow_run_id)
    tags = run.data.tags
    assert run.info.status == "FINISHED"
    assert tags["mlflow.parentRunId"] == trained.mlflow_run_id == tags["diffsweep.eval.source_run"]
    assert tags["diffsweep.kind"] == "eval" and tags["diffsweep.eval.probe"] == "val_loss_test"
    assert tags["diffsweep.eval.step"] == "8" and json.loads(tags["diffsweep.eval.settings"]) == {"tokens": 128}
    assert tags["diffsweep.eval.run_key"] == trained.run_key and tags["mlflow.note.content"] == "a note"
    assert run.info.experiment_id == client.get_run(trained.mlflow_run_id).info.experiment_id
    assert run.data.metrics["test/val_loss"] == e.result.metrics["test/val_loss"]
    assert [(m.step, m.value) for m in client.get_metric_history(e.mlflow_run_id, "test/val_loss")] == \
        [(8, e.result.metrics["test/val_loss"])]  # at the checkpoint's step
    assert sorted((m.step, m.value) for m in client.get_metric_history(e.mlflow_run_id, "test/curve")) == \
        [(1, 1.0), (2, 0.5)]
    artifacts = sorted(a.path for a in client.list_artifacts(e.mlflow_run_id))
    assert artifacts == ["loss.json", "loss.txt"]
    assert (e.out_dir / "loss.json").is_file() and e.out_dir == trained_run.absolute() / "eval/step_00000008/val_loss_test"

    again = evaluate(trained, [(probe, parse_settings(probe, {"tokens": 128}))], uri=mlflow_store, echo=lines.append)
    assert not again[0].ran and again[0].mlflow_run_id == e.mlflow_run_id and "reused" in lines[-1]
    assert again[0].value == e.value == e.result.metrics["test/val_loss"] and again[0].code == e.code
    other = evaluate(trained, [(probe, parse_settings(probe, {"tokens": 64}))], uri=mlflow_store, echo=lines.append)
    assert other[0].ran and other[0].mlflow_run_id != e.mlflow_run_id  # other settings, another evaluation
    forced = evaluate(trained, [(probe, parse_settings(probe, {"tokens": 128}))], uri=mlflow_store, force=True,
                      echo=lines.append)
    assert forced[0].ran and forced[0].result.metrics == e.result.metrics  # deterministic


def test_a_failing_probe_marks_its_run_failed(trained_run, mlflow_store):
    class Broken(ValLoss):
        name = "broken_test"

        def run(self, ctx, settings):
            raise RuntimeError("boom")

    trained = load_trained(trained_run)
    with pytest.raises(RuntimeError, match="boom"):
        evaluate(trained, [(Broken(), LossSettings())], uri=mlflow_store, echo=lambda line: None)
    client = mlflow_client(mlflow_store)
    exp = client.get_run(trained.mlflow_run_id).info.experiment_id
    runs = client.search_runs([exp], "tags.`diffsweep.eval.probe` = 'broken_test'")
    assert [r.info.status for r in runs] == ["FAILED"]


def test_an_interrupted_probe_marks_its_run_killed_and_a_rerun_evaluates_it(trained_run, mlflow_store):
    class Interrupted(ValLoss):
        name = "interrupted_test"

        def run(self, ctx, settings):
            raise KeyboardInterrupt

    trained = load_trained(trained_run)
    with pytest.raises(KeyboardInterrupt):
        evaluate(trained, [(Interrupted(), LossSettings())], uri=mlflow_store, echo=lambda line: None)
    client = mlflow_client(mlflow_store)
    exp = client.get_run(trained.mlflow_run_id).info.experiment_id
    runs = client.search_runs([exp], "tags.`diffsweep.eval.probe` = 'interrupted_test'")
    assert [r.info.status for r in runs] == ["KILLED"]
    Interrupted.run = ValLoss.run  # the same probe and key, now finishing: not skipped (only FINISHED ones are)
    (again,) = evaluate(trained, [(Interrupted(), LossSettings())], uri=mlflow_store, echo=lambda line: None)
    assert again.ran and client.get_run(again.mlflow_run_id).info.status == "FINISHED"


def test_bad_requests_name_the_field(tmp_path):
    for names, items, key in [([], [], "probes"), (["nosuch"], [], "probes"),
                              (["outliers"], ["needle.samples=3"], "probe_settings"),
                              (["outliers"], ["outliers"], "probe_settings")]:
        with pytest.raises(ConfigError) as caught:
            probe_requests(names, items)
        assert caught.value.key == key, (names, items, caught.value)
    with pytest.raises(ConfigError, match="not found"):
        find_checkpoint(tmp_path / "nothing")
    with pytest.raises(ConfigError, match="has no checkpoint"):
        find_checkpoint(tmp_path)


def test_bad_input_through_the_cli_is_one_line_and_runs_nothing(trained_run, tmp_path, new_store):
    cases = [
        (["eval", str(trained_run), "--probe", "nosuch"], "error: --probe: expected one of ["),
        (["eval", str(tmp_path), "--probe", "outliers"], f"error: {tmp_path}: has no checkpoint"),
        (["eval", str(trained_run), "--probe", "outliers", "--probe-set", "needle.samples=2"],
         "error: --probe-set: 'needle.samples=2' sets probe 'needle', which is not asked for"),
        (["eval", str(trained_run), "--probe", "outliers", "--probe-set", "outliers.tokns=2"],
         "error: outliers.tokns: unknown setting of probe outliers (did you mean 'tokens'?)"),
        (["eval", str(trained_run)], "error: --probe: expected at least one probe"),
    ]
    kept = trained_run / "eval"
    before = sorted(kept.rglob("*")) if kept.exists() else []  # other tests of the session may have evaluated it
    for args, line in cases:
        r = cli(*args, cwd=tmp_path, env=new_store)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith(line), (args, r.stderr)
    assert not (tmp_path / "mlflow.db").exists()
    assert (sorted(kept.rglob("*")) if kept.exists() else []) == before


def test_every_probe_through_the_cli_on_a_trained_run(trained_run, tmp_path, mlflow_store):
    """What a user runs: every built-in probe on the newest checkpoint, then the same command
    again (nothing new runs)."""
    args = ["eval", str(trained_run), "--probe", "outliers", "--probe", "quantization", "--probe", "nll_position",
            "--probe", "needle", "--probe", "attention_focus",
            "--probe-set", "outliers.tokens=512", "--probe-set", "quantization.tokens=512",
            "--probe-set", "quantization.bits=[16, 8, 4]", "--probe-set", "nll_position.documents=4",
            "--probe-set", "needle.needles=2", "--probe-set", "needle.queries=1", "--probe-set", "needle.samples=2",
            "--probe-set", "needle.depths=[0, 100]", "--probe-set", "attention_focus.needles=2",
            "--probe-set", "attention_focus.samples=2", "--probe", "icl",
            "--probe-set", f"icl.data={Path(__file__).parent / 'data' / 'topics.jsonl'}", "--probe-set", "icl.shots=[1]",
            "--probe-set", "icl.queries=8", "--probe-set", "icl.permutations=2", "--probe-set", "icl.seeds=1", "--json"]
    env = {"MLFLOW_TRACKING_URI": mlflow_store}
    r = cli(*args, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    done = {e["probe"]: e for e in json.loads(r.stdout)}
    assert r.stderr.splitlines()[-1] == "6 evaluations of 1 finished run: 6 evaluated, 0 reused", r.stderr
    for e in done.values():  # one line each: run, step, probe, headline, how
        assert e["run"] and e["headline"] and e["value"] is not None, e
        assert f"{e['run']} step 12 {e['probe']}: {e['headline']} = {e['value']:.6g}; evaluated in" in r.stderr
    assert "outliers/attn_logit/layer_01" not in r.stderr  # the details are in the files and MLflow
    assert list(done) == ["outliers", "quantization", "nll_position", "needle", "attention_focus", "icl"]
    assert all(e["ran"] and e["step"] == 12 for e in done.values())
    assert done["outliers"]["metrics"]["outliers/attn_logit/top1"] > 0
    assert {row["bits"] for row in done["quantization"]["tables"]["quantization"]} == {16, 8, 4}
    assert 0 <= done["needle"]["metrics"]["needle/N2_R1/accuracy"] <= 1
    assert done["nll_position"]["metrics"]["nll_position/mean"] > 0
    kept = trained_run / "eval" / "step_00000012"
    assert 0 <= done["icl"]["metrics"]["icl/shots_01/accuracy"] <= 1
    # The shared run's eval folder may also hold other tests' probes: each of these six is there.
    assert {"attention_focus", "icl", "needle", "nll_position", "outliers", "quantization"} <= {
        p.name for p in kept.iterdir()}
    assert any(p.suffix == ".png" for p in (kept / "needle").iterdir())
    assert any(p.suffix == ".png" for p in (kept / "nll_position").iterdir())
    client = mlflow_client(mlflow_store)
    for e in done.values():
        run = client.get_run(e["mlflow_run_id"])
        assert run.info.status == "FINISHED" and run.data.tags["diffsweep.eval.probe"] == e["probe"]
    again = cli(*args, cwd=tmp_path, env=env)
    assert again.returncode == 0 and not any(e["ran"] for e in json.loads(again.stdout))
    assert again.stderr.count("reused: logged") == 6
    assert "6 evaluations of 1 finished run: 0 evaluated, 6 reused" in again.stderr
    verbose = cli("eval", str(trained_run), "--probe", "nll_position", "--probe-set", "nll_position.documents=4",
                  "--force", "--verbose", cwd=tmp_path, env=env)
    assert verbose.returncode == 0, verbose.stderr
    assert "  nll_position/mean = " in verbose.stdout and "  files: " in verbose.stdout, verbose.stdout
    assert verbose.stdout.splitlines()[-1] == "1 evaluation of 1 finished run: 1 evaluated, 0 reused"


def test_a_change_in_the_code_evaluates_again_and_unchanged_code_is_reused(trained_run, mlflow_store, monkeypatch):
    """The key holds the package's code digest: with other code (a dependency of the probe edited,
    here its digest changed) the evaluation runs again; with this code it is reused, and the line
    says from which code and when it was logged."""
    from diffsweep.eval import identity

    trained = load_trained(trained_run / "checkpoints" / "step_00000006")
    probe = ValLoss()
    settings = parse_settings(probe, {"tokens": 128})
    lines: list[str] = []
    (first,) = evaluate(trained, [(probe, settings)], uri=mlflow_store, echo=lines.append)
    assert first.ran and first.code == identity.code_digest(probe)
    assert mlflow_client(mlflow_store).get_run(first.mlflow_run_id).data.tags["diffsweep.eval.code"] == first.code
    (same,) = evaluate(trained, [(probe, settings)], uri=mlflow_store, echo=lines.append)
    assert not same.ran and same.mlflow_run_id == first.mlflow_run_id
    assert lines[-1].startswith(f"{same.run_name} step 6 val_loss_test: test/val_loss = {first.value:.6g}; reused: "
                                f"logged {first.logged[:10]}")
    assert f"by this same code ({first.code})" in lines[-1] and first.mlflow_run_id in lines[-1]

    monkeypatch.setattr(identity, "package_code", lambda start=(): "0123456789abcdef")  # e.g. eval/tap.py edited
    (changed,) = evaluate(trained, [(probe, settings)], uri=mlflow_store, echo=lines.append)
    assert changed.ran and changed.mlflow_run_id != first.mlflow_run_id and changed.code != first.code
    assert "evaluated in" in lines[-1]
    monkeypatch.undo()
    (back,) = evaluate(trained, [(probe, settings)], uri=mlflow_store, echo=lines.append)
    assert not back.ran and back.mlflow_run_id == first.mlflow_run_id  # the result this code logged


@pytest.mark.parametrize("probe_name", ["outliers", "quantization", "needle", "nll_position", "attention_focus"])
def test_the_code_digest_covers_what_the_probe_uses(probe_name, tmp_path, monkeypatch):
    """A copy of the packages: editing a module the probe reaches only through others (eval/tap.py,
    eval/needles.py, the validation windows of data/dataset.py, the token-loss helpers of
    train/probes.py, the model, an attention kind named only by its registry's string, the Triton
    kernels) changes its digest; a module it never reaches (the CLI) and touching nothing do not."""
    import shutil

    from diffsweep.eval import identity

    roots = identity._package_roots()
    copies = {name: tmp_path / name for name in roots}
    for name, root in roots.items():
        shutil.copytree(root, copies[name], ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(identity, "_package_roots", lambda: copies)
    probe = get_probe(probe_name)

    def digest() -> str:  # from scratch: the modules reached found again (what a new process does)
        identity.code_modules.cache_clear()
        return identity.code_digest(probe)

    try:
        before = digest()
        assert digest() == before
        # Each edit appends a comment: the modules reached are the same before and after it, so the
        # digest is taken with the set just found (the sources are read again each time); finding
        # them again after each edit (an AST walk of ~90 modules, ~1 CPU-s) would find the same set.
        for module, changes in [("diffsweep/eval/tap.py", True), ("diffsweep/eval/needles.py", True),
                                ("diffsweep/data/dataset.py", True), ("diffsweep/train/probes.py", True),
                                ("diffsweep/model/transformer.py", True), ("diffsweep/model/attention/diff_v1.py", True),
                                ("diffsweep_kernels/triton_diff.py", True), ("diffsweep/cli/eval.py", False)]:
            path = tmp_path / module
            text = path.read_text()
            path.write_text(text + "\n# edited\n")
            assert (identity.code_digest(probe) != before) is changes, module
            path.write_text(text)
        assert identity.code_digest(probe) == before
        assert digest() == before
    finally:
        identity.code_modules.cache_clear()


@dataclass(frozen=True)
class CapSettings:
    tokens: int = 1_000_000_000


class CappedProbe(ValLoss):
    """Asks for more validation tokens than the split has, as outliers' 409,600 on a small split."""

    name = "capped_test"
    Settings = CapSettings

    def run(self, ctx, settings):
        from diffsweep.eval.probes.outliers import validation_windows

        result = ProbeResult()
        data = validation_windows(ctx, settings.tokens, result)
        result.metrics["test/val_loss"] = float(token_losses(ctx.model, data[:1]).double().mean())
        return result


def test_a_setting_capped_by_the_data_is_said_and_logged(trained_run, mlflow_store):
    trained = load_trained(trained_run / "checkpoints" / "step_00000010")
    probe = CappedProbe()
    lines: list[str] = []
    (e,) = evaluate(trained, [(probe, CapSettings())], uri=mlflow_store, echo=lines.append)
    used = (len(trained.dataset.split("val")) - 1) // 128 * 128
    assert e.capped == {"tokens": f"1,000,000,000 asked, {used:,} used (the validation split has "
                                  f"{len(trained.dataset.split('val')):,} tokens: {used // 128} windows of 128)"}
    assert f"; capped capped_test.tokens: 1,000,000,000 asked, {used:,} used" in lines[-1]
    run = mlflow_client(mlflow_store).get_run(e.mlflow_run_id)
    assert run.data.params["capped_test.tokens"] == "1000000000" and run.data.params["capped_test.tokens.used"] == \
        str(used)
    assert json.loads(run.data.tags["diffsweep.eval.capped"]) == e.capped
    (again,) = evaluate(trained, [(probe, CapSettings())], uri=mlflow_store, echo=lines.append)
    assert not again.ran and again.capped == e.capped and "; capped capped_test.tokens" in lines[-1]


def test_the_key_holds_the_quantization_granularity(trained_run):
    from diffsweep.eval.identity import eval_key

    trained = load_trained(trained_run)
    probe = get_probe("quantization")
    keys = {g: eval_key(trained, probe, parse_settings(probe, {"granularity": g})) for g in ("tensor", "head", "row")}
    assert len(set(keys.values())) == 3
    assert keys["head"] == eval_key(trained, probe, parse_settings(probe, {}))  # the default is head
