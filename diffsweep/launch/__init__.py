"""Launching sweeps: cluster profiles, resources per run (pure), the ledger, the job callable,
code snapshots, submission through a scheduler (``scheduler``: the interface and registry;
``jobs.slurm_scheduler``: Slurm arrays; ``jobs.local_scheduler``: local processes), run states and
reconciliation. Imports of submitit and mlflow happen where they are used."""
