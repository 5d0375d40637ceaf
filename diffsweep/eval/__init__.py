"""Evaluation: the paper's probes on a trained run's checkpoint (``diffsweep eval``).

``probe``: what a probe is (``Probe``, its settings, ``EvalContext``, ``ProbeResult``) and the
registry of probes by name; ``probes/``: one module per probe; ``loading``: a trained model,
tokenizer and validation split from a run directory or checkpoint; ``runner``: runs probes on one
checkpoint and logs each as an MLflow run linked to its training run.
"""
