"""Launching sweeps: cluster profiles, resources per run (pure), the ledger, the job callable,
code snapshots, submission through a scheduler (``schedulers``: Slurm arrays or local processes,
one registered class each), run states and reconciliation. Imports of submitit and mlflow happen
where they are used."""
