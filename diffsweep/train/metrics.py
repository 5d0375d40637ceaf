"""Small stateful pieces of the per-step metrics: loss-spike counting and MFU's denominator."""

from __future__ import annotations

import math
from collections import deque

import torch

SPIKE_WINDOW = 100  # steps of history a spike is judged against
SPIKE_MIN_HISTORY = 20  # no spikes are called before this many steps of history

# Dense bf16 peak FLOP/s per GPU (vendor datasheets, no sparsity), matched on the device name.
PEAK_BF16_FLOPS: dict[str, float] = {
    "H200": 989e12,
    "H100": 989e12,  # SXM; the PCIe card's 756e12 is matched first below
    "A100": 312e12,
}
_H100_PCIE = 756e12


def peak_flops(device: torch.device) -> float | None:
    """Peak FLOP/s of ``device`` for MFU; None on CPU or an unknown GPU (no MFU is logged)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    if "H100" in name and "PCIe" in name:
        return _H100_PCIE
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)


class SpikeCounter:
    """Counts spikes of a per-step value (the loss; the gradient norm): a value more than
    ``threshold`` standard deviations above the mean of the previous ``SPIKE_WINDOW`` values. Its
    state is saved in checkpoints."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.history: deque[float] = deque(maxlen=SPIKE_WINDOW)
        self.count = 0

    def add(self, loss: float) -> int:
        """Record a step's loss; returns the number of spikes so far."""
        if len(self.history) >= SPIKE_MIN_HISTORY:
            mean = sum(self.history) / len(self.history)
            std = math.sqrt(sum((x - mean) ** 2 for x in self.history) / len(self.history))
            if loss > mean + self.threshold * max(std, 1e-8):
                self.count += 1
        self.history.append(loss)
        return self.count

    def state_dict(self) -> dict:
        return {"history": list(self.history), "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.history = deque(state["history"], maxlen=SPIKE_WINDOW)
        self.count = state["count"]
