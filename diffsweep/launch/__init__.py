"""Launching sweeps: cluster profiles, resources per run (pure), the ledger, the job callable,
code snapshots, submission through submitit (Slurm arrays or local processes), run states and
reconciliation. Imports of submitit and mlflow happen where they are used."""
