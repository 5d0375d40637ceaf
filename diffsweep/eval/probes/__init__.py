"""The built-in probes: one module per probe (``diffsweep.eval.probe.PROBES`` names them)."""
