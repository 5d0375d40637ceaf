"""``diffsweep doctor``, the self-test of a cluster and a launch's configuration: running the checks
in order, with the run directory's and the store's (``checks``), what a check is and how the
doctor's jobs are submitted (``jobs``), what its probe jobs run (``probe``), Slurm's checks
(``slurm``) and the preemption check (``preempt``)."""
