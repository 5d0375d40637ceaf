"""Comparing a sweep's finished runs, read from the MLflow store: training rows against seed noise
(``runs``, ``diffsweep compare``) and probe results run by run (``diffsweep compare --probes``:
``probes`` reads the evaluations, ``probe_tables`` builds and judges the tables, ``probe_report``
and ``probe_output`` write them). Sits beside
``diffsweep.scaling``, above ``diffsweep.sweep``, which stays pure spec and expansion."""
