"""Prompts of the multi-needle retrieval test (paper §3.3, Table 2 and Fig. 5).

The paper follows the multi-needle protocol of LWM (Liu et al., 2024a) and Gemini 1.5 (Reid et al.,
2024): N needles, each "a concise sentence that assigns a unique magic number to a specific city",
are inserted into a haystack of ordinary text; R of the N cities are asked for; "the answer needle"
sits at a depth of 0, 25, 50, 75 or 100% of the context, "while placing other distracting needles
randomly"; 50 samples per (length, depth) cell. ``needle_prompts`` says exactly how a prompt is made
here (and where it departs from LWM). Everything is a pure function of ``seed`` and the arguments
(``random.Random`` seeded by a string, which Python hashes with SHA-512: the same prompts on every
machine and run). See docs/eval.md, 'The probes'.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy as np

NEEDLE = "\nThe magic number of {city} is {number}.\n"
ANSWER_PREFIX = "\nThe magic number of {city} is"

# Distinct cities, from LWM's RANDOM_NEEDLE_CITIES (scripts/eval_needle_multi.py) without its duplicates.
CITIES: tuple[str, ...] = (
    "Chicago", "Yangon", "Antananarivo", "Colombo", "Almaty", "Sydney", "Mexico City", "Seattle", "Lagos",
    "Amsterdam", "Belgrade", "Cairo", "Baghdad", "Damascus", "Kigali", "Dakar", "Sofia", "Victoria",
    "Tashkent", "Mumbai", "Barcelona", "Amman", "Toronto", "Bratislava", "Johannesburg", "Thimphu",
    "Bangkok", "Santiago", "San Francisco", "Paris", "Rabat", "Copenhagen", "Madrid", "Ho Chi Minh City",
    "Sarajevo", "Delhi", "Istanbul", "Khartoum", "Helsinki", "Doha", "Kuala Lumpur", "Budapest",
    "Shanghai", "Moscow", "Los Angeles", "Oslo", "Berlin", "Bangalore", "Tokyo", "Melbourne",
    "Port Louis", "Lisbon", "Nairobi", "Kampala", "Lima", "Maputo", "Vancouver", "Dubai", "Jakarta",
    "Yerevan", "Beirut", "Athens", "Bucharest", "Brussels", "Tunis", "Astana", "Seoul", "Buenos Aires",
    "Vienna",
)


class Encoder(Protocol):
    """What prompts need of a tokenizer (``diffsweep.data.tokenizers.Tokenizer`` is one)."""

    def encode(self, text: str) -> list[int]: ...


@dataclass(frozen=True)
class NeedlePrompt:
    """One prompt of a sample: ``tokens`` (exactly the context length) ask for ``city``.

    ``cities``/``numbers``/``needle_offsets``: the sample's N needles, in the sample's order, and
    the token offset in ``tokens`` where each needle starts. ``haystack_tokens``: H, the haystack
    tokens in the prompt; ``answer_haystack_offset``: haystack tokens before the answer needle
    (``round(depth / 100 * H)``)."""

    tokens: list[int]
    cities: tuple[str, ...]
    numbers: tuple[str, ...]
    needle_offsets: tuple[int, ...]
    city: str
    answer: str
    depth: float
    sample: int
    haystack_tokens: int
    answer_haystack_offset: int


def question(cities: Sequence[str]) -> str:
    """The question naming every queried city (LWM's wording, with "magic number of")."""
    if len(cities) == 1:
        return f"\nWhat is the magic number of {cities[0]}?"
    return f"\nWhat are the magic numbers of {', '.join(cities[:-1])} and {cities[-1]}?"


def random_number(rng: random.Random, digits: int) -> str:
    """A number with exactly ``digits`` digits (no leading zero), uniform."""
    return str(rng.randrange(10 ** (digits - 1), 10**digits))


def needle_prompts(
    haystack: Sequence[int] | np.ndarray,
    tokenizer: Encoder,
    *,
    context: int,
    needles: int,
    queries: int,
    depth: float,
    samples: int,
    digits: int = 7,
    seed: int = 0,
) -> list[NeedlePrompt]:
    """``samples * queries`` prompts of ``context`` tokens (sample by sample, query by query).

    ``haystack``: token ids to cut haystacks from (the validation split). Raises ``ValueError``
    when an argument is out of range or the needles and question leave no room for a haystack.

    Exactly:

    - The haystack is a slice of token ids of the run's own validation split (a random start per
      sample), so the prompt's length is exact in tokens: every prompt is ``context`` tokens.
    - A needle is ``NEEDLE`` ("\\nThe magic number of CITY is NUMBER.\\n", LWM's needle is "\\nThe
      special magic CITY number is: NUMBER\\n"), encoded on its own and spliced between two haystack
      tokens. NUMBER has ``digits`` digits (LWM's default ``rnd_number_digits = 7``), uniform over
      ``[10**(digits-1), 10**digits)``; the N numbers and the N cities of a sample are distinct.
    - The prompt ends with the tail: "\\nWhat is the magic number of A?" (R = 1) or "\\nWhat are the
      magic numbers of A, B and C?" (all R queried cities, as LWM's question), then the answer
      prefix "\\nThe magic number of CITY is" of one queried city; the model's greedy continuation
      should be " NUMBER". A sample has one prompt per queried city (R prompts).
    - Depth: in the prompt asking for city X, X's needle is the answer needle. With a haystack of
      H tokens (H = context - needle tokens - tail tokens), a needle at fraction f goes after
      ``round(f * H)`` haystack tokens: the answer needle at ``f = depth / 100`` (so 0% is the
      first thing in the prompt, 100% is right before the question); every other needle at a
      fraction drawn uniformly from [0, 1] once per sample (shared by its R prompts). Needles at
      the same haystack offset keep the order of the sample's cities. Unlike LWM, a needle is not
      moved back to the previous period (token ids carry no reliable sentence boundary).
    """
    if not 1 <= queries <= needles <= len(CITIES):
        raise ValueError(f"need 1 <= queries ({queries}) <= needles ({needles}) <= {len(CITIES)} cities")
    if not 0 <= depth <= 100:
        raise ValueError(f"depth {depth} is not a percentage in [0, 100]")
    if digits < 1:
        raise ValueError(f"digits must be >= 1, got {digits}")
    out = []
    for sample in range(samples):
        rng = random.Random(f"diffsweep.needle/{seed}/{context}/{needles}/{queries}/{float(depth)}/{digits}/{sample}")
        cities = rng.sample(CITIES, needles)
        numbers: list[str] = []
        while len(numbers) < needles:
            number = random_number(rng, digits)
            if number not in numbers:
                numbers.append(number)
        asked = cities[:queries]  # the cities are a random sample: the first R are a random choice
        fractions = [rng.random() for _ in cities]
        needle_ids = [tokenizer.encode(NEEDLE.format(city=c, number=n)) for c, n in zip(cities, numbers, strict=True)]
        asked_ids = tokenizer.encode(question(asked))
        tails = [asked_ids + tokenizer.encode(ANSWER_PREFIX.format(city=c)) for c in asked]
        fixed = sum(len(ids) for ids in needle_ids)
        longest = fixed + max(len(t) for t in tails)
        if context - longest < 1:
            raise ValueError(f"a context of {context} tokens cannot hold {needles} needles and the question "
                             f"({longest} tokens) and a haystack")
        if len(haystack) < context - fixed - min(len(t) for t in tails):
            raise ValueError(f"the haystack text has {len(haystack)} tokens, fewer than a context of {context} needs")
        start = rng.randrange(0, len(haystack) - (context - fixed - min(len(t) for t in tails)) + 1)
        for answer_index, tail in enumerate(tails):
            size = context - fixed - len(tail)  # H: the haystack tokens of this prompt
            hay = [int(t) for t in haystack[start : start + size]]
            at = [round(f * size) for f in fractions]
            at[answer_index] = round(depth / 100 * size)
            tokens: list[int] = []
            offsets = [0] * needles
            done = 0
            for i in sorted(range(needles), key=lambda i: (at[i], i)):
                tokens += hay[done : at[i]]
                done = at[i]
                offsets[i] = len(tokens)
                tokens += needle_ids[i]
            tokens += hay[done:] + tail
            assert len(tokens) == context, (len(tokens), context)
            out.append(NeedlePrompt(
                tokens=tokens, cities=tuple(cities), numbers=tuple(numbers), needle_offsets=tuple(offsets),
                city=cities[answer_index], answer=numbers[answer_index], depth=float(depth), sample=sample,
                haystack_tokens=size, answer_haystack_offset=at[answer_index],
            ))
    return out


def recovered(generated: str, answer: str) -> bool:
    """Whether a greedy continuation states ``answer``: after optional whitespace, its run of
    digits is exactly ``answer`` (a prefix, extra digits or other text first are wrong)."""
    text = generated.lstrip()
    run = len(text) - len(text.lstrip("0123456789"))
    return run > 0 and text[:run] == answer
