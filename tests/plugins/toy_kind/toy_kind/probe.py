"""A probe from the user's own package (an entry point in the group ``diffsweep.probes``): the toy
kind's learned output gate of each layer, read from a trained checkpoint (no data needed). One file
and one registration (pyproject.toml), as docs/extending.md says."""

from __future__ import annotations

from dataclasses import dataclass

from diffsweep.config import ConfigError
from diffsweep.eval.probe import EvalContext, Probe, ProbeResult


@dataclass(frozen=True)
class GateSettings:
    """``scale``: multiplies the gates reported (a setting, so that ``--probe-set gates.scale=2`` is
    decoded and checked like a built-in probe's)."""

    scale: float = 1.0


class GateProbe(Probe):
    name = "gates"
    summary = "the toy kind's learned output gate of each layer"
    cites = "none (a plug-in example)"
    headline = "gates/mean"
    Settings = GateSettings

    def check(self, settings: GateSettings, config) -> None:
        if config.model.attention.kind != "toy":
            raise ConfigError("gates", f"measures runs of the toy kind, not {config.model.attention.kind}")
        if not settings.scale > 0:
            raise ConfigError("gates.scale", f"expected a positive number, got {settings.scale}")

    def run(self, ctx: EvalContext, settings: GateSettings) -> ProbeResult:
        gates = [float(p) for name, p in ctx.model.named_parameters() if name.endswith(".gate")]
        return ProbeResult(metrics={"gates/mean": settings.scale * sum(gates) / len(gates),
                                    "gates/layers": float(len(gates))})
