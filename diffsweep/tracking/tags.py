"""The names of the tags diffsweep writes on MLflow runs and reads back, in one place.

A training run carries what ``fit`` and ``compare`` read of it (its run key, sweep, architecture,
size and counts) and where it came from (code, host, Slurm ids); a result run (an evaluation, a fit,
a comparison, the doctor's check) says what it is in ``KIND``, so that no reader takes it for a
training run. ``tag_is`` spells a search filter on one tag.
"""

from __future__ import annotations

# What a run is: absent on a training run; one of these on a result run (never an input to a fit).
KIND = "diffsweep.kind"
EVAL_KIND = "eval"  # a probe's evaluation of a checkpoint (diffsweep.eval)
FIT_KIND = "fit"  # a fit of a ladder (diffsweep.scaling)
COMPARISON_KIND = "comparison"  # a comparison of a sweep's evaluations (diffsweep.compare)
DOCTOR_KIND = "doctor"  # the doctor's check that a job can log (diffsweep.launch.doctor.probe)

# A training run: what it is (diffsweep.train.run_record) and which sweep run it is (launch.submit).
RUN_KEY = "diffsweep.run_key"
RUN_DIR = "diffsweep.run_dir"
SWEEP = "diffsweep.sweep"
SWEEP_RUN = "diffsweep.sweep_run"
ARCH = "diffsweep.arch"
SIZE = "diffsweep.size"
PARAMS = "diffsweep.params"
NON_EMBEDDING_PARAMS = "diffsweep.non_embedding_params"
FLOPS_PER_TOKEN = "diffsweep.flops_per_token"
TOKENIZER = "diffsweep.tokenizer"
THREADS = "diffsweep.threads"
PROCESSES = "diffsweep.processes"
END_REASON = "diffsweep.end_reason"  # why a run ended other than finished (diffsweep.tracking.logger)
ATTEMPTS = "diffsweep.attempts"  # how many times it started; each start's facts under ATTEMPT + number
ATTEMPT = "diffsweep.attempt."
# A cooldown branch (diffsweep.train.branch): its parent's run key, the step and checkpoint it started from.
BRANCH_PARENT_KEY = "diffsweep.branch.parent_run_key"
BRANCH_STEP = "diffsweep.branch.step"
BRANCH_CHECKPOINT = "diffsweep.branch.checkpoint"

# Where any run came from (diffsweep.tracking.provenance).
CODE = "diffsweep.code"
GIT_COMMIT = "diffsweep.git_commit"
GIT_DIRTY = "diffsweep.git_dirty"
HOST = "diffsweep.host"
SLURM_JOB_ID = "diffsweep.slurm_job_id"
SLURM_ARRAY_JOB_ID = "diffsweep.slurm_array_job_id"
SLURM_ARRAY_TASK_ID = "diffsweep.slurm_array_task_id"

# An evaluation run (diffsweep.eval.runner): which probe, settings and code, of which checkpoint of
# which training run (its run key, name, attention kind and sweep, copied for ``compare``).
EVAL_KEY = "diffsweep.eval.key"
EVAL_CODE = "diffsweep.eval.code"
EVAL_PROBE = "diffsweep.eval.probe"
EVAL_SETTINGS = "diffsweep.eval.settings"
EVAL_STEP = "diffsweep.eval.step"
EVAL_CHECKPOINT = "diffsweep.eval.checkpoint"
EVAL_CAPPED = "diffsweep.eval.capped"
EVAL_RUN_KEY = "diffsweep.eval.run_key"
EVAL_RUN_NAME = "diffsweep.eval.run_name"
EVAL_ATTENTION_KIND = "diffsweep.eval.kind"
EVAL_SOURCE_RUN = "diffsweep.eval.source_run"
EVAL_SWEEP = "diffsweep.eval.sweep"
EVAL_SWEEP_RUN = "diffsweep.eval.sweep_run"

# A fit run (diffsweep.scaling.pipeline): of what, from which runs, with which references.
FIT_OF = "diffsweep.fit_of"
FIT_HASH = "diffsweep.fit_hash"
SOURCE_RUNS = "diffsweep.source_runs"
SOURCE_RUN_COUNT = "diffsweep.source_run_count"
REFS = "diffsweep.refs"

# A comparison run (diffsweep.compare.probe_output).
COMPARISON_SWEEP = "diffsweep.comparison.sweep"
COMPARISON_OF = "diffsweep.comparison.of"
COMPARISON_PROBES = "diffsweep.comparison.probes"
COMPARISON_BASELINE = "diffsweep.comparison.baseline"
COMPARISON_STEP = "diffsweep.comparison.step"
COMPARISON_RUNS = "diffsweep.comparison.runs"

# MLflow's own, which its UI shows.
NOTE = "mlflow.note.content"
PARENT_RUN = "mlflow.parentRunId"
RUN_NAME = "mlflow.runName"
MLFLOW_GIT_COMMIT = "mlflow.source.git.commit"


def tag_is(name: str, value: str) -> str:
    """A search filter: runs whose tag ``name`` is ``value``."""
    return f"tags.`{name}` = '{value}'"
