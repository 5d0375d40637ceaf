"""Benchmarks that print numbers: attention kernels (``attention``) and full-model training
throughput (``model``), every variant measured side by side in one run, so ratios are what to
trust. Used by ``diffsweep bench`` and the scripts in ``analysis/benchmarks/``."""
