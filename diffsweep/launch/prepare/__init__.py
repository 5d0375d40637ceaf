"""``diffsweep data prepare --launch``: a dataset's shards written by one job array, resumable, and
``data status | logs | cancel`` (``launch``); the launch folder beside the dataset and its record
``launch.json``, the store of the array's attempts (``record``)."""
