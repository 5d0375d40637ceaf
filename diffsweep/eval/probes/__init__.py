"""One module per probe (registered in diffsweep.eval.probe.PROBES)."""
