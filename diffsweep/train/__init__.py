"""Training: the loop (``trainer``), optimiser and schedule, checkpoints, probes, preemption and
MLflow tracking. Imports torch; nothing here imports ``launch`` or ``fit``."""
