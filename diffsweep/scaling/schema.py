"""The CSV that ``diffsweep fit --csv`` reads, in words (imported by the CLI's help: no heavy imports)."""

CSV_SCHEMA = (
    "Required: arch (e.g. transformer, diff_v1), loss (validation cross-entropy, nats/token), num_params "
    "(total parameters), tokens (training tokens at that evaluation); every row has all four (an empty cell is "
    "refused; write nan or inf as the loss of a diverged run: it is dropped with a warning). Optional: seed (replicates of one size: "
    "the noise estimate), num_non_embedding_params (for --count non_embedding; default num_params), "
    "point (final | checkpoint; default final), step and warmup_steps (a checkpoint at step <= warmup_steps is "
    "left out; without them no checkpoint can be told to be in warmup, so all are used, with a warning), run_name, "
    "run_id, run_key, parent (a cooldown branch's parent run key: a run and its branches share one run offset), "
    "sweep, size, flops, schedule, lambda_init, head_norm, v2_pairing, v2_lambda, lr, min_lr, "
    "batch_tokens (carried into points.csv; size groups the arms of the arm audit, which also compares lr, min_lr, "
    "batch_tokens, schedule and warmup_steps). A frozen points.csv (with used, reason) refits exactly its used rows.")
