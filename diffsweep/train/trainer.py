"""``train``: run one config to its step budget, resumably, logging to MLflow.

Everything that can be wrong with the input (data, output directory, checkpoint, tracking
store) is checked before anything is created; a newest checkpoint whose checksums do not match
is skipped, with a warning, for the one before it. Then the loop: one optimizer step per batch,
validation and probes every ``eval_every`` steps, an atomic checkpoint every
``checkpoint_every`` steps. A non-finite loss or gradient norm stops the run at once (FAILED,
no checkpoint written); SIGUSR2/SIGTERM stop it at the next step boundary after a checkpoint
(KILLED, resumable).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from diffsweep import lockfile
from diffsweep.config import ConfigError, Precision, ResolvedConfig, to_dict
from diffsweep.config.identity import run_key
from diffsweep.data.dataset import TokenDataset, batch_starts, check_compatible, open_dataset, val_starts, windows
from diffsweep.model import counting
from diffsweep.model.compile import CompileWatch, compile_blocks, eager, use_compile
from diffsweep.model.transformer import LanguageModel, build_model
from diffsweep.tracking.logger import MlflowTracker, Tracker
from diffsweep.tracking.store import check_tracking
from diffsweep.train import checkpoint as ckpt
from diffsweep.train import distributed
from diffsweep.train.branch import branch_tags, check_branch
from diffsweep.train.distributed import World
from diffsweep.train.metrics import SpikeCounter, peak_flops
from diffsweep.train.optim import build_optimizer, lr_at
from diffsweep.train.preemption import PreemptionFlag
from diffsweep.train.probes import LossSums, ar_hit_mask, probe, token_losses
from diffsweep.train.run_record import run_tracking_uri, start_tracking

TRAINER_LOCK = ".trainer.lock"  # held by the training process (rank 0) for the whole training


class Diverged(RuntimeError):
    """The loss or the gradient norm stopped being finite."""


@dataclass(frozen=True)
class TrainResult:
    """How a ``train`` call ended: ``finished``, ``preempted`` (resumable) or ``diverged``."""

    status: str
    step: int
    total_steps: int
    run_dir: Path
    run_id: str | None
    reason: str = ""
    signal: str | None = None  # preempted: the signal's name (SIGUSR2, SIGTERM)


StepCallback = Callable[[int, dict[str, float]], None]


def train(
    config: ResolvedConfig,
    run_dir: Path,
    *,
    experiment: str = "diffsweep",
    resume_from: Path | None = None,
    branch_from: Path | None = None,
    callbacks: tuple[StepCallback, ...] = (),
    echo: Callable[[str], None] = print,
    tags: dict[str, str] | None = None,
) -> TrainResult:
    """Train ``config`` in ``run_dir`` (checkpoints in ``run_dir/checkpoints``).

    Resumes from ``resume_from``, else from the newest intact checkpoint in ``run_dir``; a run
    that already reached its budget returns at once. ``branch_from``: a checkpoint of another run
    to start from when ``run_dir`` has none of its own yet (a cooldown branch, diffsweep.train.branch:
    a new MLflow run tagged with its parent). ``callbacks`` get ``(step, metrics)`` after every
    step (and its checkpoint, when it saved one). ``tags`` are added to a new MLflow run (e.g. the sweep that launched it).

    Under torchrun or a multi-task Slurm job every process calls this (``distributed``): each
    trains on its slice of every global batch; only rank 0 prints and tracks;
    every process writes its own checkpoint shards.

    One trainer per run directory: rank 0 holds ``run_dir/.trainer.lock`` (``diffsweep.lockfile``)
    throughout, and a second trainer is refused (ConfigError naming the first's host and pid)
    while the first lives; the lock of one that died is taken over with a warning.
    """
    world = distributed.world_from_env()
    rank = world.rank
    if rank != 0:
        echo = _quiet
    t = config.train
    _check_batch_split(t, world)
    use_compile(t.compile, config.model.attention.backend, _device())  # refused before anything is made
    dataset = open_dataset(config.data.path)
    check_compatible(dataset.meta, config.data.tokenizer, config.model.vocab_size, t.seq_len)
    _check_writable(run_dir)
    # Two trainers in one run directory would both write its checkpoints and its MLflow run.
    lock = lockfile.hold(run_dir / TRAINER_LOCK, "train", str(run_dir), "another trainer is using this run "
                         "directory") if rank == 0 else nullcontext()
    with lock:
        return _train(config, run_dir, world, dataset, experiment, (resume_from, branch_from), callbacks, echo, tags)


def _train(config: ResolvedConfig, run_dir: Path, world: World, dataset: TokenDataset, experiment: str,
           start: tuple[Path | None, Path | None], callbacks: tuple[StepCallback, ...], echo: Callable[[str], None],
           tags: dict[str, str] | None) -> TrainResult:
    """``train`` once the input is checked and the run directory is this trainer's."""
    uri = run_tracking_uri(run_dir)
    check_tracking(uri)

    # Signals only set a flag from here on; one arriving during set-up stops before the first step.
    with PreemptionFlag() as flag:
        device = _device()
        with distributed.process_group(world, device):
            # The model (DDP's reducer holds the group) is freed when this returns, before the
            # group is destroyed (see distributed.process_group).
            return _train_in_group(config, run_dir, world, dataset, experiment, start, callbacks, echo, tags,
                                   uri, flag, device)


def _train_in_group(config: ResolvedConfig, run_dir: Path, world: World, dataset: TokenDataset, experiment: str,
                    start: tuple[Path | None, Path | None], callbacks: tuple[StepCallback, ...],
                    echo: Callable[[str], None], tags: dict[str, str] | None, uri: str, flag: PreemptionFlag,
                    device: torch.device) -> TrainResult:
    """``_train`` inside the process group: resume (or branch), build, track and run the loop."""
    rank, t = world.rank, config.train
    resume_from, branch_from = start
    resume_path, state = _resume_point(resume_from, run_dir, config, dataset, world, echo)
    branched = state is None and branch_from is not None
    if branched:
        assert branch_from is not None
        resume_path, state = branch_from, _load_resume_state(branch_from, config, dataset, world, branch=True)
        ckpt.verify_shards(branch_from)
    if state is not None and state["step"] >= t.total_steps:
        if rank == 0 and state["mlflow_run_id"]:
            MlflowTracker(uri, run_id=state["mlflow_run_id"]).ensure_finished()
        echo(f"{run_dir}: already finished ({state['step']} steps); nothing to do")
        return TrainResult("finished", state["step"], t.total_steps, run_dir, state["mlflow_run_id"])
    torch.manual_seed(t.seed)
    autocast = autocast_dtype(t.precision, device)
    built = build_model(config.model, device=device, compute_dtype=autocast or torch.float32)
    built.activation_checkpointing = t.activation_checkpointing
    compiled, note = use_compile(t.compile, config.model.attention.backend, device)
    if note:
        echo(note)
    if compiled:
        compile_blocks(built)
    model: torch.nn.Module = distributed.wrap(built, t.parallel, world, device, autocast)
    optimizer = build_optimizer(model, t)
    run = _Run(config, dataset, model, optimizer, device, autocast, run_dir, echo, world)
    run.compile_watch = CompileWatch() if compiled else None
    if state is not None:
        assert resume_path is not None  # a state is read from a checkpoint
        run.restore(state, resume_path)
        echo(f"{'branching' if branched else 'resuming'} {run_dir.name} at step {state['step']} of {t.total_steps}"
             + (f" from {resume_path}" if branched else "")
             + (f" on {world.world_size} processes" if world.distributed else ""))
    if branched:  # a run of its own: a new MLflow run, tagged with its parent
        assert state is not None and resume_path is not None
        tags = (tags or {}) | branch_tags(state, resume_path)
        state = {**state, "mlflow_run_id": None}
    run.tracker = tracker = start_tracking(config, run_dir, uri, experiment, state, resume_path, world,
                                            tags or {})
    try:
        return run.loop(flag, callbacks)
    except KeyboardInterrupt:
        _finish_quietly(tracker, "KILLED", "interrupted (SIGINT)", echo)
        raise
    except BaseException as exc:
        _finish_quietly(tracker, "FAILED", f"{type(exc).__name__}: {exc}", echo)
        raise


def _quiet(line: str) -> None:
    """Ranks other than 0 print nothing (rank 0 speaks for the job)."""


def _check_batch_split(t, world: World) -> None:
    """Every process gets the same whole number of micro-batches of each global batch."""
    sequences = t.batch_tokens // t.seq_len
    if sequences % (world.world_size * t.micro_batch_size):
        raise ConfigError("train.micro_batch_size",
                          f"{world.world_size} processes x {t.micro_batch_size} sequences per micro-batch do "
                          f"not divide the {sequences} sequences of a global batch (train.batch_tokens / seq_len)")


def _finish_quietly(tracker, status: str, reason: str, echo: Callable[[str], None]) -> None:
    """End the run after a failure without letting a tracking error hide the original one."""
    try:
        tracker.finish(status, reason)
    except Exception as exc:  # noqa: BLE001 (the training error is what the user must see)
        echo(f"warning: could not mark MLflow run {tracker.run_id} {status}: {type(exc).__name__}: {exc}")


def _device() -> torch.device:
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


class _Run:
    """The state of one training job and the steps of its loop."""

    def __init__(self, config, dataset, model, optimizer, device, autocast_dtype, run_dir, echo, world: World) -> None:
        self.config, self.t, self.world, self.rank = config, config.train, world, world.rank
        self.train_tokens, self.val_tokens = dataset.split("train"), dataset.split("val")
        self.fingerprint = dataset.meta.fingerprint
        self.model = model  # the model as trained: wrapped in DDP, sharded by FSDP2, or plain
        module = distributed.unwrap(model)
        assert isinstance(module, LanguageModel)  # DDP's module, or the model itself (FSDP2 shards in place)
        self.module = module
        self.optimizer = optimizer
        self.device, self.autocast_dtype = device, autocast_dtype
        self.run_dir, self.echo = run_dir, echo
        self.total = self.t.total_steps
        self.sequences_per_step = self.t.batch_tokens // self.t.seq_len
        self.step, self.tokens_seen, self.spikes = 0, 0, SpikeCounter(self.t.spike_threshold)
        self.grad_spikes = SpikeCounter(self.t.spike_threshold)  # the same rule on the gradient norm
        self.run_key = run_key(config)
        # Set once the run is tracked (after restore), before loop; a NullTracker on ranks other than 0.
        self.tracker: Tracker | None = None
        flops = counting.train_flops_per_token(config.model, self.t.seq_len)
        peak = peak_flops(device) if autocast_dtype == torch.bfloat16 else None  # peaks are bf16 figures
        self.mfu_scale = flops / peak if peak else None
        self.compile_watch: CompileWatch | None = None  # blocks compiled: compile seconds and recompiles logged

    @property
    def tracking(self) -> Tracker:
        """``tracker``, which the loop and what it calls (save, state) need."""
        if self.tracker is None:
            raise RuntimeError("the run is not tracked yet: set its tracker before the loop")
        return self.tracker

    def loop(self, flag: PreemptionFlag, callbacks: tuple[StepCallback, ...]) -> TrainResult:
        saved_at = self.step
        while self.step < self.total:
            if self.step == saved_at and self._stop(flag):  # signalled during set-up: nothing new to save
                return self._preempted(flag)
            self.step += 1
            metrics = self.train_step()
            if self.step % self.t.eval_every == 0 or self.step == self.total:
                metrics |= self.evaluate()
            self.tracking.log(self.step, metrics)
            if self.step % self.t.log_every == 0 or self.step == self.total:
                self.echo(_line(self.step, self.total, metrics))
            if self.step % self.t.checkpoint_every == 0 or self.step == self.total or self.step in self.t.checkpoint_at:
                self.save()
                saved_at = self.step
            for callback in callbacks:  # after the step's checkpoint: a callback may hand it on
                callback(self.step, metrics)
            if self.step < self.total and self._stop(flag):
                if saved_at != self.step:
                    self.save()
                return self._preempted(flag)
        self.tracking.finish("FINISHED")
        self.echo(f"finished {self.total} steps; MLflow run {self.tracking.run_id}")
        return TrainResult("finished", self.step, self.total, self.run_dir, self.tracking.run_id)

    def _stop(self, flag: PreemptionFlag) -> bool:
        """Whether to stop now: every process decides the same (a signal may reach only one)."""
        return distributed.any_rank(flag.requested, self.world)

    def _preempted(self, flag: PreemptionFlag) -> TrainResult:
        name = flag.signal.name if flag.signal is not None else "a signal to another process"
        reason = f"preempted by {name} at step {self.step}; resume to continue"
        self.tracking.finish("KILLED", reason)
        self.echo(f"{reason} (checkpoint in {self.run_dir / 'checkpoints'})")
        return TrainResult("preempted", self.step, self.total, self.run_dir, self.tracking.run_id, reason,
                           flag.signal.name if flag.signal is not None else None)

    def _autocast(self):
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _window(self, tokens: np.ndarray, starts: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(windows(tokens, starts, self.t.seq_len)).to(self.device)

    def train_step(self) -> dict[str, float]:
        """One optimizer step over ``batch_tokens`` (gradient accumulation over micro-batches)."""
        started = time.perf_counter()
        lr = lr_at(self.step, self.t)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        starts = batch_starts(self.t.seed, self.step, self.sequences_per_step, len(self.train_tokens), self.t.seq_len)
        share = len(starts) // self.world.world_size  # this process's slice of the global batch
        starts = starts[self.world.rank * share : (self.world.rank + 1) * share]
        micro = self.t.micro_batch_size
        num_micro = len(starts) // micro
        loss_sum = torch.zeros((), device=self.device)
        for i in range(num_micro):
            window = self._window(self.train_tokens, starts[i * micro : (i + 1) * micro])
            with self._gradient_sync(last=i == num_micro - 1):
                with self._autocast():
                    logits = self.model(window[:, :-1])
                loss = F.cross_entropy(logits.float().flatten(0, 1), window[:, 1:].flatten())
                (loss / num_micro).backward()  # DDP / FSDP2 average the gradients over processes
            loss_sum += loss.detach()
        clip = self.t.grad_clip if self.t.grad_clip > 0 else math.inf
        total_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        grad_norm = float(total_norm.full_tensor() if hasattr(total_norm, "full_tensor") else total_norm)  # FSDP2
        loss_value = distributed.mean(float(loss_sum) / num_micro, self.world)
        if not (math.isfinite(loss_value) and math.isfinite(grad_norm)):
            raise Diverged(f"non-finite {'loss' if not math.isfinite(loss_value) else 'gradient norm'} "
                           f"at step {self.step} (loss {loss_value}, grad norm {grad_norm})")
        self.optimizer.step()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        self.tokens_seen += self.t.batch_tokens
        metrics = {
            "train/loss": loss_value,
            "train/lr": lr,
            "train/grad_norm": grad_norm,
            "train/tokens": float(self.tokens_seen),
            "train/tokens_per_s": self.t.batch_tokens / seconds,
            "train/loss_spikes": float(self.spikes.add(loss_value)),
            "train/grad_norm_spikes": float(self.grad_spikes.add(grad_norm)),
        }
        if self.mfu_scale is not None:
            metrics["train/mfu"] = metrics["train/tokens_per_s"] * self.mfu_scale
        if self.compile_watch is not None:
            found, warning = self.compile_watch.metrics(self.step, seconds)
            metrics |= found
            if warning:
                self.echo(warning)
        return metrics

    def _gradient_sync(self, *, last: bool):
        """DDP all-reduces gradients on the last micro-batch of a step only."""
        if last or not isinstance(self.model, torch.nn.parallel.DistributedDataParallel):
            return nullcontext()
        return self.model.no_sync()

    def evaluate(self) -> dict[str, float]:
        """``_evaluate``, with compiled blocks run eagerly (no graph of its own)."""
        with eager() if self.compile_watch is not None else nullcontext():
            return self._evaluate()

    @torch.no_grad()
    def _evaluate(self) -> dict[str, float]:
        """Validation loss (all, AR-Hit, Others) over the fixed validation windows, then probes.

        The windows' micro-batches are dealt to the processes in turn and their loss sums added
        up. A process left without one in the last round runs the first again without counting
        it: FSDP2 needs every process in each forward."""
        self.model.eval()
        starts = val_starts(len(self.val_tokens), self.t.seq_len, self.t.eval_tokens)
        micro, size, rank = self.t.micro_batch_size, self.world.world_size, self.world.rank
        batches = [starts[i : i + micro] for i in range(0, len(starts), micro)]
        sums = LossSums()
        for first in range(0, len(batches), size):
            mine = first + rank
            window = self._window(self.val_tokens, batches[mine if mine < len(batches) else 0])
            with self._autocast():
                losses = token_losses(self.model, window)
            if mine < len(batches):
                sums.add(losses, ar_hit_mask(window))
        if self.world.distributed:
            sums.reduce(lambda values: distributed.sum_all(values, self.world))
        with self._autocast():
            probes = probe(self.module, self._window(self.val_tokens, starts[:1]))
        return sums.metrics() | probes

    def state(self, optimizer_groups: list) -> dict:
        """The training state beside the (sharded) weights and optimizer state of a checkpoint."""
        cuda = [torch.cuda.get_rng_state(self.device)] if self.device.type == "cuda" else []
        return {
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "optimizer_groups": optimizer_groups,  # hyperparameters by parameter name
            "scheduler": {"schedule": self.t.schedule.value, "step": self.step, "total_steps": self.total},
            "data": {"seed": self.t.seed, "next_step": self.step + 1, "fingerprint": self.fingerprint},
            "rng": {"torch": torch.get_rng_state(), "cuda": cuda},
            "run_key": self.run_key,
            "mlflow_run_id": self.tracking.run_id,
            "metrics_state": {"spikes": self.spikes.state_dict(), "grad_norm_spikes": self.grad_spikes.state_dict()},
            "config": to_dict(self.config),
        }

    def restore(self, state: dict, path: Path) -> None:
        if "model" not in state:  # sharded: every process reads its shards, resharded to this world
            tensors, _ = distributed.sharded_state(self.model, self.optimizer)
            ckpt.load_tensors(path, tensors)
            distributed.load_sharded_state(self.model, self.optimizer, tensors, state["optimizer_groups"])
        elif _by_position(state):
            # A single file from before multi-process training: the same single-process model
            # and optimizer read it as they wrote it.
            self.module.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        else:  # a single file with the whole state keyed by parameter name
            distributed.load_full_state(self.model, self.optimizer, state["model"], state["optimizer"])
        self.step, self.tokens_seen = state["step"], state["tokens_seen"]
        self.spikes.load_state_dict(state["metrics_state"]["spikes"])
        if "grad_norm_spikes" in state["metrics_state"]:  # absent from checkpoints of before it was counted
            self.grad_spikes.load_state_dict(state["metrics_state"]["grad_norm_spikes"])
        torch.set_rng_state(state["rng"]["torch"])
        if state["rng"]["cuda"] and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["rng"]["cuda"][0], self.device)

    def save(self) -> None:
        """Checkpoint: every process writes its own shards. Metrics go to the store first: if the
        job dies in between, the resume replays from the older checkpoint and skips the steps the
        store already has."""
        self.tracking.flush()
        tensors, groups = distributed.sharded_state(self.model, self.optimizer)
        bad = distributed.non_finite(tensors["model"])
        if distributed.any_rank(bool(bad), self.world):
            raise Diverged(f"non-finite weights after step {self.step} ({bad[0] if bad else 'on another rank'}); "
                           "not checkpointed")
        ckpt.save_checkpoint(self.run_dir / "checkpoints", self.state(groups), tensors, keep=self.t.keep_checkpoints,
                             pinned=frozenset(self.t.checkpoint_at))


def _line(step: int, total: int, m: dict[str, float]) -> str:
    line = (f"step {step}/{total} loss {m['train/loss']:.4f} lr {m['train/lr']:.2e} "
            f"gnorm {m['train/grad_norm']:.3f} tok/s {m['train/tokens_per_s']:.0f}")
    if "val/loss" in m:
        line += f" | val {m['val/loss']:.4f} (AR-Hit {m.get('val/loss_ar_hit', float('nan')):.4f})"
    return line


def autocast_dtype(precision: Precision, device: torch.device) -> torch.dtype | None:
    """bf16 autocast on GPU (and when asked for), fp32 (no autocast) on CPU by default."""
    if precision is Precision.BF16 or (precision is Precision.AUTO and device.type == "cuda"):
        return torch.bfloat16
    return None


def _check_writable(run_dir: Path) -> None:
    """The run directory exists and is writable, or can be created (checked without creating it)."""
    existing = run_dir
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        what = "is not a directory" if not existing.is_dir() else "is not writable"
        raise ConfigError(str(run_dir), f"cannot create the run directory: {existing} {what}")


def _resume_point(resume_from: Path | None, run_dir: Path, config: ResolvedConfig, dataset: TokenDataset, world: World,
                  echo: Callable[[str], None]) -> tuple[Path | None, dict | None]:
    """The checkpoint to resume from and its training state (None, None to start afresh):
    ``resume_from``, else the run's newest intact one. A damaged newest one (see
    ``ckpt.CorruptCheckpoint``) is skipped with a warning for the one before it; a damaged
    ``resume_from``, or the run's oldest, is a ``ConfigError``.

    Every process decides the same: each reads the same small files, and the shards' checksums
    are checked together (``ckpt.verify_shards``). Nothing is created yet."""
    candidates = [resume_from] if resume_from is not None else ckpt.list_checkpoints(run_dir / "checkpoints")[::-1]
    for i, path in enumerate(candidates):
        try:
            state = _load_resume_state(path, config, dataset, world)
            ckpt.verify_shards(path)
            return path, state
        except ckpt.CorruptCheckpoint as exc:
            if resume_from is not None:
                raise
            if i + 1 == len(candidates):
                raise ConfigError(exc.key, f"{exc.message}; no earlier checkpoint to fall back to (move {path} "
                                  "aside to train the run from its start)") from exc
            echo(f"warning: {exc}; resuming from the checkpoint before it, {candidates[i + 1].name}")
    return None, None


def _load_resume_state(path: Path, config: ResolvedConfig, dataset: TokenDataset, world: World, *,
                       branch: bool = False) -> dict:
    """A checkpoint's training state, checked against this run: one of its own (the same run key),
    or with ``branch`` another run's to start from (``branch.check_branch``). Nothing is written."""
    state = ckpt.load_checkpoint(path)
    if branch:
        check_branch(state, config, path)
    elif state["run_key"] != run_key(config):
        raise ConfigError(str(path), f"written by a different config (run key {state['run_key']}, "
                          f"this config's is {run_key(config)})")
    if state["data"]["fingerprint"] != dataset.meta.fingerprint:
        raise ConfigError(str(path), f"written for a different dataset than {dataset.path}")
    if world.distributed and _by_position(state):
        raise ConfigError(str(path), f"step {state['step']} was written by an older diffsweep (optimizer state "
                          f"by position); {'branch from' if branch else 'resume'} it on one process")
    return state


def _by_position(state: dict) -> bool:
    """A single-file checkpoint from before multi-process training: optimizer state keyed 0, 1, 2, ..."""
    return "model" in state and bool(state["optimizer"]["state"]) and \
        all(isinstance(k, int) for k in state["optimizer"]["state"])
