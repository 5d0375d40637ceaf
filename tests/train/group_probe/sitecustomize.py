"""Imported at start-up by the Python processes of a test that puts this folder on PYTHONPATH and
sets ``DIFFSWEEP_GROUP_PROBE`` to a folder: each training process writes there how many DDP
models were still alive when it destroyed its process group. It must be none: a group whose last
reference is DDP's reducer is destroyed with the GIL held, and gloo's destructor then deadlocked at
exit (see ``diffsweep.train.distributed.process_group``)."""

import os

if os.environ.get("DIFFSWEEP_GROUP_PROBE") and os.environ.get("RANK") is not None:
    import gc

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    _destroy = dist.destroy_process_group

    def _probed_destroy(*args, **kwargs):
        alive = sum(isinstance(obj, DistributedDataParallel) for obj in gc.get_objects())
        path = os.path.join(os.environ["DIFFSWEEP_GROUP_PROBE"], f"rank{os.environ['RANK']}")
        with open(path, "w") as f:
            f.write(str(alive))
        return _destroy(*args, **kwargs)

    dist.destroy_process_group = _probed_destroy
