"""Comparing a sweep's finished runs, read from the MLflow store: training rows against seed noise
(``runs``, ``diffsweep compare``) and probe results run by run (``probe_tables``, with its report
``probe_report`` and outputs ``probe_output``: ``diffsweep compare --probes``). Sits beside
``diffsweep.scaling``, above ``diffsweep.sweep``, which stays pure spec and expansion."""
