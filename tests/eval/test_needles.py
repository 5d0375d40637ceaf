"""Multi-needle prompts (paper §3.3): exact length, N needles, the answer needle at its depth,
distinct cities and numbers, reproducible from the seed; with bytes and with a trained BPE."""

from __future__ import annotations

import pydoc_data.topics
import re

import pytest

from diffsweep.data.tokenizers import BytesTokenizer, load_tokenizer
from diffsweep.eval.needles import ANSWER_PREFIX, CITIES, NEEDLE, needle_prompts, question, recovered

PATTERN = re.compile(r"The magic number of ([A-Z][A-Za-z ]*) is (\d+)\.")
TEXT = "\n".join(pydoc_data.topics.topics.values())


def _find(tokens: list[int], part: list[int]) -> list[int]:
    return [i for i in range(len(tokens) - len(part) + 1) if tokens[i : i + len(part)] == part]


def _check(tokenizer, haystack, *, context, needles, queries, depth, samples=3, digits=7):
    prompts = needle_prompts(haystack, tokenizer, context=context, needles=needles, queries=queries, depth=depth,
                             samples=samples, digits=digits, seed=5)
    assert len(prompts) == samples * queries
    for p in prompts:
        assert len(p.tokens) == context
        assert len(set(p.cities)) == needles and set(p.cities) <= set(CITIES)
        assert len(set(p.numbers)) == needles and all(len(n) == digits and n[0] != "0" for n in p.numbers)
        assert p.answer == p.numbers[p.cities.index(p.city)]
        # Exactly N needles, in the text and as token ids, where needle_offsets says.
        found = PATTERN.findall(tokenizer.decode(p.tokens))
        assert sorted(found) == sorted(zip(p.cities, p.numbers, strict=True))
        lengths = []
        for city, number, offset in zip(p.cities, p.numbers, p.needle_offsets, strict=True):
            ids = tokenizer.encode(NEEDLE.format(city=city, number=number))
            assert _find(p.tokens, ids) == [offset]
            lengths.append(len(ids))
        # The answer needle: after round(depth * H) haystack tokens, i.e. its offset less the
        # needles before it; as a fraction of the haystack, within one needle of the depth.
        answer = p.cities.index(p.city)
        offset = p.needle_offsets[answer]
        before = sum(n for o, n, i in zip(p.needle_offsets, lengths, range(needles)) if o < offset or
                     (o == offset and i < answer))
        assert offset - before == p.answer_haystack_offset == round(depth / 100 * p.haystack_tokens)
        assert abs(offset / p.haystack_tokens - depth / 100) <= needles * max(lengths) / p.haystack_tokens
        tail = tokenizer.encode(question(p.cities[:queries])) + tokenizer.encode(ANSWER_PREFIX.format(city=p.city))
        assert p.tokens[-len(tail):] == tail
        assert p.haystack_tokens == context - sum(lengths) - len(tail)
    return prompts


@pytest.mark.parametrize("depth", [0, 25, 50, 75, 100])
def test_prompts_bytes(depth):
    tok = BytesTokenizer()
    prompts = _check(tok, tok.encode(TEXT[:20000]), context=400, needles=4, queries=2, depth=depth)
    if depth == 0:
        assert all(p.needle_offsets[p.cities.index(p.city)] == 0 for p in prompts)
    if depth == 100:  # the answer needle is followed only by (possibly other needles and) the question
        for p in prompts:
            tail = tok.decode(p.tokens[p.needle_offsets[p.cities.index(p.city)]:])
            assert PATTERN.sub("", tail).strip().startswith("What are the magic numbers of")
    text = tok.decode(prompts[0].tokens)
    assert text.endswith(f"The magic number of {prompts[0].city} is")
    assert f"What are the magic numbers of {prompts[0].cities[0]} and {prompts[0].cities[1]}?" in text


def test_prompts_bpe(text_dataset):
    import numpy as np

    from diffsweep.data.dataset import open_dataset

    data = open_dataset(text_dataset)
    tok = load_tokenizer(data.meta.tokenizer, text_dataset)
    val = np.asarray(data.split("val"))
    for depth in (0, 50, 100):
        _check(tok, val, context=300, needles=6, queries=1, depth=depth, digits=6)


def test_seeded():
    tok = BytesTokenizer()
    hay = tok.encode(TEXT[:20000])

    def make(seed):
        return needle_prompts(hay, tok, context=300, needles=3, queries=1, depth=50, samples=4, seed=seed)

    assert make(1) == make(1)
    a, b = make(1), make(2)
    assert [p.tokens for p in a] != [p.tokens for p in b]
    assert [p.numbers for p in a] != [p.numbers for p in b]
    assert len({p.numbers for p in a}) == len({p.cities for p in a}) == 4  # the samples differ too


def test_errors():
    tok = BytesTokenizer()
    hay = tok.encode(TEXT[:5000])
    with pytest.raises(ValueError, match="cannot hold 4 needles"):
        needle_prompts(hay, tok, context=120, needles=4, queries=1, depth=0, samples=1)
    with pytest.raises(ValueError, match="queries"):
        needle_prompts(hay, tok, context=400, needles=2, queries=3, depth=0, samples=1)
    with pytest.raises(ValueError, match="depth"):
        needle_prompts(hay, tok, context=400, needles=2, queries=1, depth=101, samples=1)
    with pytest.raises(ValueError, match="fewer than a context"):
        needle_prompts(hay[:200], tok, context=400, needles=2, queries=1, depth=0, samples=1)


@pytest.mark.parametrize(("text", "ok"), [
    (" 1234567.", True), ("1234567\n", True), (" 1234567", True), ("  1234567 is it", True),
    (" 123456.", False), (" 12345678", False), (" 1234568.", False), (" is 1234567", False), ("", False),
    (" 123 4567", False),
])
def test_recovered(text, ok):
    assert recovered(text, "1234567") is ok
