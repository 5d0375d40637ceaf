"""The needle probe: greedy decoding is the argmax loop, accuracy per cell and its table/plot,
the scoring of continuations, and settings refused with one error naming ``needle.KEY``."""

from __future__ import annotations

import pydoc_data.topics

import numpy as np
import pytest
import torch

from diffsweep.config import ConfigError, load_config
from diffsweep.data.tokenizers import BytesTokenizer
from diffsweep.eval.needles import needle_prompts
from diffsweep.eval.probe import EvalContext, get_probe, parse_settings
from diffsweep.eval.probes.needle import NeedleSettings, _answered, greedy, heat_map_figure
from diffsweep.model.transformer import build_model

TEXT = "\n".join(pydoc_data.topics.topics.values())[:30000]


def _ctx(tmp_path, seq_len=512) -> EvalContext:
    config = load_config(None, ["model.size=tiny-xs", "model.vocab_size=256", "model.attention.kind=diff_v1",
                                "model.attention.backend=sdpa", f"train.seq_len={seq_len}"])
    torch.manual_seed(0)
    model = build_model(config.model).eval()
    tok = BytesTokenizer()
    return EvalContext(model=model, config=config, tokenizer=tok, val_tokens=np.array(tok.encode(TEXT), np.uint16),
                       device=torch.device("cpu"), autocast_dtype=None, out_dir=tmp_path, seed=3)


def test_greedy_is_the_argmax_loop(tmp_path):
    ctx = _ctx(tmp_path)
    prompt = needle_prompts(ctx.val_tokens, ctx.tokenizer, context=200, needles=2, queries=1, depth=50, samples=2)
    tokens = torch.tensor([p.tokens for p in prompt])
    out = greedy(ctx.model, tokens, 6)
    with torch.no_grad():
        for row in range(2):
            seq = tokens[row].tolist()
            for _ in range(6):
                seq.append(int(ctx.model(torch.tensor([seq]))[0, -1].argmax()))
            assert out[row].tolist() == seq[-6:]
    # Early stop: once every row is finished, no more steps.
    assert greedy(ctx.model, tokens, 6, finished=lambda row: len(row) >= 2).shape == (2, 2)


def test_answered():
    assert not _answered(" 12345") and not _answered("  ") and not _answered("")
    assert _answered(" 12345.") and _answered(" x") and _answered("1 ")


def test_run_on_a_random_model(tmp_path):
    ctx = _ctx(tmp_path)
    probe = get_probe("needle")
    settings = parse_settings(probe, {"needles": 2, "queries": 2, "contexts": [256, 320], "depths": [0, 100],
                                      "samples": 2, "batch": 3, "digits": 4})
    probe.check(settings, ctx.config)
    result = probe.run(ctx, settings)
    cells = {k: v for k, v in result.metrics.items() if k.endswith("/accuracy") and "/ctx_" in k}
    assert sorted(cells) == sorted(f"needle/N2_R2/ctx_{c:04d}/depth_{d}/accuracy"
                                   for c in (256, 320) for d in ("000", "100"))
    assert all(v in (0.0, 0.25, 0.5, 0.75, 1.0) for v in cells.values())  # 2 samples x 2 queries per cell
    assert result.metrics["needle/N2_R2/accuracy"] == pytest.approx(sum(cells.values()) / 4)
    rows = result.tables["needle"]
    assert [(r["context"], r["depth"]) for r in rows] == [(256, 0.0), (256, 100.0), (320, 0.0), (320, 100.0)]
    assert all(r["needles"] == 2 and r["queries"] == 2 and r["samples"] == 2 for r in rows)
    assert [p.name for p in result.files] == ["needle_N2_R2.png"] and result.files[0].stat().st_size > 1000


def test_an_answering_model_scores_one(tmp_path):
    """A model whose greedy output is the needle's number scores 1: a stand-in for the language
    model that reads the answer off the prompt (the probe's own decoding and scoring run)."""
    ctx = _ctx(tmp_path)
    tok = ctx.tokenizer

    class Reader(torch.nn.Module):
        """Finds the asked city's needle in the prompt and emits " NUMBER." one byte per step."""

        def forward(self, tokens):
            logits = torch.zeros(tokens.shape[0], tokens.shape[1], 256)
            for b, row in enumerate(tokens.tolist()):
                text = tok.decode(row)
                asked = text.rsplit("\n", 1)[1]  # "The magic number of CITY is ..." (+ what was generated)
                city, _, said = asked.removeprefix("The magic number of ").partition(" is")
                number = text.split(f"The magic number of {city} is ")[1].split(".")[0]
                logits[b, -1, (" " + number + ".").encode()[len(said)]] = 1.0
            return logits

    ctx.model = Reader()  # type: ignore[assignment]
    probe = get_probe("needle")
    settings = parse_settings(probe, {"needles": 3, "queries": 2, "contexts": [320], "depths": [50], "samples": 2})
    result = probe.run(ctx, settings)
    assert result.metrics["needle/N3_R2/accuracy"] == 1.0


@pytest.mark.parametrize(("items", "key", "match"), [
    ({"queries": 3, "needles": 2}, "needle.queries", "1 to needles = 2"),
    ({"needles": 500}, "needle.needles", "1 to 69 needles"),
    ({"depths": [0, 101]}, "needle.depths", "0 to 100"),
    ({"contexts": [512]}, "needle.contexts", "train.seq_len = 512"),
    ({"samples": 0}, "needle.samples", "positive"),
])
def test_check_refuses(tmp_path, items, key, match):
    ctx = _ctx(tmp_path)
    probe = get_probe("needle")
    with pytest.raises(ConfigError, match=match) as err:
        probe.check(parse_settings(probe, items), ctx.config)
    assert err.value.key == key


def test_check_defaults_and_longer(tmp_path):
    ctx = _ctx(tmp_path)
    probe = get_probe("needle")
    probe.check(parse_settings(probe, {}), ctx.config)  # the default context fits the trained length
    probe.check(parse_settings(probe, {"contexts": [504]}), ctx.config)  # 504 + 8 answer tokens = 512
    probe.check(parse_settings(probe, {"contexts": [4096], "allow_longer": True}), ctx.config)


def test_too_short_context_is_a_config_error(tmp_path):
    ctx = _ctx(tmp_path)
    probe = get_probe("needle")
    with pytest.raises(ConfigError, match="cannot hold") as err:
        probe.run(ctx, parse_settings(probe, {"needles": 6, "contexts": [100], "samples": 1}))
    assert err.value.key == "needle.contexts"


def test_longer_context_runs_with_a_note(tmp_path):
    ctx = _ctx(tmp_path, seq_len=256)
    probe = get_probe("needle")
    settings = parse_settings(probe, {"needles": 1, "queries": 1, "contexts": [300], "depths": [50], "samples": 1,
                                      "allow_longer": True})
    probe.check(settings, ctx.config)
    result = probe.run(ctx, settings)
    (note,) = result.notes
    assert note == "needle: context 300 with its answer is longer than the trained 256 tokens (RoPE extrapolation)"
    assert 0.0 <= result.metrics["needle/N1_R1/accuracy"] <= 1.0


@pytest.mark.parametrize("num_contexts", [1, 2, 8])
def test_the_heat_map_title_lies_within_the_figure(num_contexts):
    """The longest kind name on the narrowest map (one context): the title, laid out as the probe
    saves it (``save_figure``'s tight layout), is inside the figure's box."""
    import matplotlib.pyplot as plt

    rows = [{"context": 100 * (c + 1), "depth": d, "accuracy": 0.5} for c in range(num_contexts)
            for d in (0.0, 50.0, 100.0)]
    fig = heat_map_figure(rows, "Differential Transformer V2 (DIFF V2)", NeedleSettings(samples=50))
    try:
        fig.tight_layout()
        fig.canvas.draw()
        (title,) = [t for t in (fig._suptitle, *(ax.title for ax in fig.axes)) if t is not None and t.get_text()]
        assert "Differential Transformer V2" in title.get_text()
        box, figure = title.get_window_extent(fig.canvas.get_renderer()), fig.bbox
        assert figure.x0 <= box.x0 and box.x1 <= figure.x1 and figure.y0 <= box.y0 and box.y1 <= figure.y1, \
            (box, figure)
        for ax in fig.axes:  # and the title covers no plot
            assert not box.overlaps(ax.get_window_extent(fig.canvas.get_renderer())), ax
    finally:
        plt.close(fig)
