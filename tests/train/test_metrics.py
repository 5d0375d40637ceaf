"""Loss-spike counting (judged against a sliding window, resumable through its state) and the MFU
denominator on CPU."""

from __future__ import annotations

import io
import math
import random

import torch

from diffsweep.train.metrics import SPIKE_MIN_HISTORY, SPIKE_WINDOW, SpikeCounter, peak_flops


def _smooth(steps: int, seed: int = 0) -> list[float]:
    """A training-like curve: exponential decay to 2.0 with small noise."""
    rng = random.Random(seed)
    return [2.0 + 8.0 * math.exp(-step / 100) + rng.gauss(0, 0.02) for step in range(steps)]


def _run(counter: SpikeCounter, losses: list[float]) -> list[int]:
    return [counter.add(loss) for loss in losses]


def test_smooth_curve_has_no_spikes():
    counter = SpikeCounter(threshold=6.0)
    assert _run(counter, _smooth(600)) == [0] * 600


def test_planted_spike_is_counted_once_at_its_step():
    """One loss jumping well above the recent mean counts exactly once, on that step; the curve
    returning to normal afterwards adds nothing."""
    losses = _smooth(600)
    losses[400] += 1.0  # the window's spread there is ~0.07 (trend + noise)
    counts = _run(SpikeCounter(threshold=6.0), losses)
    assert counts[399] == 0 and counts[400] == 1 and counts[-1] == 1


def test_two_spikes_and_threshold():
    """Two separated spikes count twice; a jump below the threshold does not count."""
    losses = _smooth(700)
    losses[350] += 1.0
    losses[500] += 1.0
    losses[650] += 0.05  # ~2.5 standard deviations of the window: under 6
    assert _run(SpikeCounter(threshold=6.0), losses)[-1] == 2
    assert _run(SpikeCounter(threshold=2.0), [2.0 + 0.02 * (-1) ** i for i in range(40)] + [2.1])[-1] == 1


def test_no_spike_is_called_before_the_minimum_history():
    """With fewer than SPIKE_MIN_HISTORY earlier losses nothing counts, however large."""
    counter = SpikeCounter(threshold=6.0)
    counts = _run(counter, [2.0 + 0.01 * (i % 2) for i in range(SPIKE_MIN_HISTORY - 1)] + [1e6])
    assert counts[-1] == 0
    assert counter.add(1e7) == 1  # the next one has SPIKE_MIN_HISTORY losses behind it


def test_a_repeated_value_is_not_a_spike():
    """On a flat history (standard deviation 0) the same loss again is not a spike."""
    counter = SpikeCounter(threshold=6.0)
    assert _run(counter, [3.0] * 50)[-1] == 0


def test_spikes_are_judged_against_the_last_window_only():
    """Old, noisy history falls out of the window: after SPIKE_WINDOW quiet steps a jump that the
    noisy past would have hidden counts."""
    noisy = [5.0 + (1.0 if i % 2 else -1.0) for i in range(SPIKE_WINDOW)]
    quiet = [5.0 + (0.01 if i % 2 else -0.01) for i in range(SPIKE_WINDOW)]
    counter = SpikeCounter(threshold=6.0)
    assert _run(counter, noisy + quiet)[-1] == 0
    assert len(counter.history) == SPIKE_WINDOW
    assert counter.add(5.5) == 1
    mixed = SpikeCounter(threshold=6.0)
    assert _run(mixed, noisy[: SPIKE_WINDOW // 2] + quiet[: SPIKE_WINDOW // 2] + [5.5])[-1] == 0


def test_state_dict_round_trip_continues_identically():
    """A counter restored from its state (through torch.save / weights_only load, as in a
    checkpoint) continues exactly as the uninterrupted one."""
    losses = _smooth(500, seed=1)
    losses[420] += 1.0
    losses[480] += 1.0
    losses[481] += 0.8
    whole = _run(SpikeCounter(threshold=6.0), losses)
    assert whole[-1] >= 2

    first = SpikeCounter(threshold=6.0)
    head = _run(first, losses[:450])
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    resumed = SpikeCounter(threshold=6.0)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    assert resumed.state_dict() == first.state_dict()
    assert resumed.history.maxlen == SPIKE_WINDOW
    assert head + _run(resumed, losses[450:]) == whole
    assert head[-1] == 1 < whole[-1]  # spikes on both sides of the restore


def test_peak_flops_is_none_on_cpu():
    """No MFU on CPU: there is no datasheet peak to divide by."""
    assert peak_flops(torch.device("cpu")) is None
