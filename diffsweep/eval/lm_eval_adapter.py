"""A diffsweep model as an lm-evaluation-harness language model (``lm_eval.api.model.LM``).

Imports lm-eval when imported: only the downstream probe imports this module, inside its ``run``,
so diffsweep works without lm-eval installed. lm-eval ships no type information, so its classes
come in through ``importlib`` (typed ``Any``). The three request kinds (``loglikelihood``,
``loglikelihood_rolling``, ``generate_until``) follow lm-eval's Hugging Face model
(``lm_eval.models.huggingface.HFLM``), as ``DiffsweepLM``'s docstring says in detail: contexts are
truncated from the left to the trained length, generation is greedy. Requests are sorted by length
(longest first) and run ``batch_size`` at a time, right-padded: the model is causal, so padding
after a row's last token changes none of its logits. See docs/eval.md, 'Downstream tasks (Table 1)
on a cluster'.
"""

from __future__ import annotations

import importlib
import json
import warnings
from collections.abc import Callable
from typing import Any

import torch

from diffsweep.config import ConfigError, ConfigWarning
from diffsweep.data.tokenizers import Tokenizer
from diffsweep.model.transformer import LanguageModel

# lm-eval has no py.typed: its modules are Any to mypy (and its classes valid bases).
_lm_model: Any = importlib.import_module("lm_eval.api.model")
_lm_utils: Any = importlib.import_module("lm_eval.utils")
_lm_model_utils: Any = importlib.import_module("lm_eval.models.utils")

# A (context, continuation) request as token ids: (the request's strings or None, context, continuation).
TokenRequest = tuple[tuple[str, str] | None, list[int], list[int]]

TASKS_KEY = "downstream.tasks"  # what a request that cannot fit the model comes from (the probe's setting)
DEFAULT_MAX_GEN_TOKS = 256  # HFLM's default, for a task that does not set max_gen_toks


class DiffsweepLM(_lm_model.TemplateLM):
    """lm-eval's view of a diffsweep ``LanguageModel`` (eval mode) and the ``Tokenizer`` it trained
    with; ``seq_len`` is the trained context (``config.train.seq_len``); ``autocast`` the context
    the forward runs in (``EvalContext.autocast``).

    The three request kinds follow lm-eval's Hugging Face model (``lm_eval.models.huggingface.HFLM``):

    - ``loglikelihood(context, continuation)``: whitespace at the end of the context moves to the
      continuation and the continuation's tokens are those of ``encode(context + continuation)`` after
      ``encode(context)``'s (``TemplateLM._encode_pair``, reused as is); an empty context is the
      end-of-text token. The model reads the last ``seq_len + 1`` tokens minus the last one (the
      context truncated from the left to the trained length); the result is the sum of the
      continuation tokens' log-probabilities and whether each is the argmax.
    - ``loglikelihood_rolling(text)``: disjoint windows of ``seq_len`` predicted tokens, each with the
      longest context that fits (``lm_eval.utils.get_rolling_token_windows``), the first conditioned
      on the end-of-text token.
    - ``generate_until(context, gen_kwargs)``: greedy decoding of up to ``max_gen_toks`` tokens from the
      context truncated from the left to ``seq_len - max_gen_toks`` tokens, stopping at a stop string
      or the end-of-text token; the text is cut before the first stop string.
    """

    backend = "causal"

    def __init__(self, model: LanguageModel, tokenizer: Tokenizer, *, seq_len: int, device: torch.device,
                 batch_size: int = 8, autocast: Callable[[], Any] | None = None,
                 max_gen_toks: int = DEFAULT_MAX_GEN_TOKS) -> None:
        super().__init__()
        self.model, self.diffsweep_tokenizer = model, tokenizer
        self.seq_len, self.batch_size, self.max_gen_toks = seq_len, batch_size, max_gen_toks
        self._device = device
        self._autocast = autocast

    # -- tokenization (TemplateLM's hooks) --------------------------------------------------------

    @property
    def eot_token_id(self) -> int | None:
        return self.diffsweep_tokenizer.eos_id  # None for the bytes tokenizer

    @property
    def max_length(self) -> int:
        return self.seq_len

    @property
    def tokenizer_name(self) -> str:
        return f"diffsweep-{self.diffsweep_tokenizer.kind.value}-{self.diffsweep_tokenizer.fingerprint()[:16]}"

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        return self.diffsweep_tokenizer.encode(string)  # no BOS: the models train on eos-separated documents

    def tok_decode(self, tokens: list[int]) -> str:
        return self.diffsweep_tokenizer.decode(tokens)

    def _first_context(self, tokens: list[int]) -> tuple[list[int], list[int]]:
        """The context of an empty prompt: the end-of-text token, or (a tokenizer without one) the
        first token, whose own probability is then not counted."""
        if self.eot_token_id is None:
            return tokens[:1], tokens[1:]
        return [self.eot_token_id], tokens

    # -- requests ---------------------------------------------------------------------------------

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """``(sum of log p(continuation tokens), whether all are the argmax)`` per request."""
        encoded: list[TokenRequest] = []
        for context, continuation in (req.args for req in requests):
            if context == "":
                ctx, cont = self._first_context(self.tok_encode(continuation))
            else:
                ctx, cont = self._encode_pair(context, continuation)
            encoded.append(((context, continuation), ctx, cont))
        return self._loglikelihood_tokens(encoded)

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """The log-likelihood of each whole text, in windows of ``seq_len`` predicted tokens."""
        results = []
        for (text,) in (req.args for req in requests):
            tokens = self.tok_encode(text)
            if not tokens:
                results.append(0.0)
                continue
            prefix, tokens = self._first_context(tokens)
            windows = [_lm_utils.make_disjoint_window(w) for w in _lm_utils.get_rolling_token_windows(
                token_list=tokens, prefix_token=prefix[0], max_seq_len=self.seq_len, context_len=1)]
            scored = self._loglikelihood_tokens([(None, ctx, cont) for ctx, cont in windows])
            total = sum(logprob for logprob, _ in scored)
            results.append(total)
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
        return results

    def _loglikelihood_tokens(self, requests: list[TokenRequest], disable_tqdm: bool = False,
                              **kwargs: Any) -> list[tuple[float, bool]]:
        order = sorted(range(len(requests)), key=lambda i: -len(requests[i][1]) - len(requests[i][2]))
        results: list[tuple[float, bool]] = [(0.0, False)] * len(requests)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            rows = []
            for i in chunk:
                _, ctx, cont = requests[i]
                if not ctx or not cont:
                    raise ValueError("loglikelihood: a request needs a context token and a continuation token")
                if len(cont) > self.seq_len:
                    raise ConfigError(TASKS_KEY, f"a task scores a continuation of {len(cont)} tokens, longer than "
                                      f"the model's context (train.seq_len = {self.seq_len})")
                rows.append((ctx + cont)[-(self.seq_len + 1):][:-1])  # truncated from the left
            logits = self._forward(rows)
            for row, i, inp in zip(range(len(chunk)), chunk, rows, strict=True):
                strings, _, cont = requests[i]
                # The logits predicting the continuation: the last len(cont) positions of this row.
                picked = logits[row, len(inp) - len(cont) : len(inp)].float().log_softmax(-1)
                target = torch.tensor(cont, device=picked.device)
                logprob = float(picked.gather(-1, target[:, None]).sum())
                greedy = bool((picked.argmax(-1) == target).all())
                results[i] = (logprob, greedy)
                if strings is not None:
                    self.cache_hook.add_partial("loglikelihood", strings, results[i])
        return results

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations, batched among requests with the same generation settings."""
        results: list[str] = [""] * len(requests)
        groups: dict[str, list[int]] = {}
        for i, req in enumerate(requests):
            groups.setdefault(json.dumps(req.args[1], sort_keys=True, default=str), []).append(i)
        for indices in groups.values():
            kwargs = _lm_model_utils.normalize_gen_kwargs(requests[indices[0]].args[1], self.max_gen_toks)
            if kwargs.get("do_sample"):
                warnings.warn(ConfigWarning("downstream: a task asks for sampling (do_sample); the diffsweep "
                                            "adapter decodes greedily"), stacklevel=2)
            eos = None if self.eot_token_id is None else self.tok_decode([self.eot_token_id])
            until = [s for s in _lm_model_utils.handle_stop_sequences(kwargs.get("until"), eos=eos) if s]
            steps = int(kwargs["max_gen_toks"])
            room = self.seq_len - steps
            if room < 1:
                raise ConfigError(TASKS_KEY, f"a task generates up to {steps} tokens (max_gen_toks), as many as the "
                                  f"model's context (train.seq_len = {self.seq_len}) or more")
            prompts = {i: self.tok_encode(requests[i].args[0])[-room:] for i in indices}
            ordered = sorted(indices, key=lambda i: -len(prompts[i]))
            for start in range(0, len(ordered), self.batch_size):
                chunk = ordered[start : start + self.batch_size]
                texts = self.greedy([prompts[i] for i in chunk], steps, until)
                for i, text in zip(chunk, texts, strict=True):
                    results[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return results

    @torch.no_grad()
    def greedy(self, prompts: list[list[int]], steps: int, until: list[str]) -> list[str]:
        """Greedy continuations of ``prompts`` (of any lengths, each at least one token), ``steps``
        tokens at most, each stopping at the end-of-text token or once its text holds a string of
        ``until``; the text is cut before the first stop string (``postprocess_generated_text``)."""
        tokens = [list(p) for p in prompts]
        new: list[list[int]] = [[] for _ in prompts]
        live = list(range(len(prompts)))
        for _ in range(steps):
            if not live:
                break
            logits = self._forward([tokens[r] for r in live])
            last = torch.tensor([len(tokens[r]) - 1 for r in live], device=logits.device)
            picked = logits[torch.arange(len(live), device=logits.device), last].float().argmax(-1).tolist()
            still = []
            for r, token in zip(live, picked, strict=True):
                if token == self.eot_token_id:
                    continue
                tokens[r].append(token)
                new[r].append(token)
                text = self.tok_decode(new[r])
                if not any(stop in text for stop in until):
                    still.append(r)
            live = still
        return [_lm_model_utils.postprocess_generated_text(self.tok_decode(row), until, None) for row in new]

    @torch.no_grad()
    def _forward(self, rows: list[list[int]]) -> torch.Tensor:
        """Logits ``(B, T, vocab)`` of right-padded ``rows`` (positions past a row's end are padding)."""
        width = max(len(row) for row in rows)
        batch = torch.zeros((len(rows), width), dtype=torch.long, device=self._device)
        for b, row in enumerate(rows):
            batch[b, : len(row)] = torch.tensor(row, dtype=torch.long)
        if self._autocast is None:
            return self.model(batch)
        with self._autocast():
            return self.model(batch)
