"""Sweeps: the sweep file (``spec``), derived values (``derive``) and pure expansion into runs
(``expand``). Imports no torch, mlflow or submitit."""

from diffsweep.sweep.expand import Expansion, SweepRun, expand
from diffsweep.sweep.spec import LaunchSettings, SweepSpec, load_sweep

__all__ = ["Expansion", "LaunchSettings", "SweepRun", "SweepSpec", "expand", "load_sweep"]
