"""The job-array core: what a launched job runs (``job.TrainJob``), one submission and where its
record is kept (``attempt``), and where jobs run: Slurm arrays (``slurm_scheduler``, with its
cluster checks in ``cluster``) and processes on this machine (``local_scheduler``, started by the
detached queue of ``local_queue``)."""
