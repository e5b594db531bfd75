"""Sampling: per-call settings, and inverse-CDF sampling from logits (one uniform number per
session per step, so a seeded generator gives the same tokens whichever rows have finished)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass
class SamplingParams:
    """How to sample one completion per session.

    Attributes:
        temperature: softmax temperature; 0 means greedy decoding.
        top_p: nucleus sampling: keep the smallest set of most likely tokens whose probability
            mass reaches ``top_p``, renormalized (1.0 keeps everything).
        max_new_tokens: at most this many tokens per completion (``finish_reason="length"``).
        stop_token_ids: stop after sampling any of these; the stop token is kept in the completion.
        stop_strings: stop once the decoded completion contains any of these (needs the engine's
            tokenizer). The completion ends with the token that completed the string, so text after
            the string inside that same token is kept; strings spanning prompt and completion are
            not detected.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if any(not s for s in self.stop_strings):
            raise ValueError("stop_strings must not contain an empty string")



def sample_from_logits(
    logits: Tensor, temperature: float, top_p: float, uniform: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Sample one token per row by inverse-CDF sampling; return the tokens and their log-probs.

    Without top-p the CDF is walked in two levels (blocks of the vocabulary, then tokens inside
    the chosen block) and only a row's max and sum are reduced for the log-prob, never a
    full-vocabulary log-softmax or cumsum: on an H200 at batch 256 over 151,936 tokens, the
    one-level scan alone took 0.31 ms a step. The same distribution, walked in the same token
    order.

    Args:
        logits: ``[B, V]`` next-token logits (any float dtype; computed in float32).
        temperature: 0 for greedy (log-probs then at temperature 1), else the softmax temperature.
        top_p: nucleus mass in (0, 1]; the kept tokens are renormalized.
        uniform: ``[B]`` numbers in [0, 1), one per row (unused when greedy).

    Returns:
        tokens ``[B]`` (long) and logprobs ``[B]`` (float32) under the sampled-from distribution.
    """
    x = logits.float()
    if temperature == 0:
        tokens = x.argmax(-1)
        return tokens, x.gather(-1, tokens[:, None]).squeeze(-1) - torch.logsumexp(x, -1)
    assert uniform is not None, "sampling needs uniform numbers"
    if temperature != 1.0:
        x = x / temperature
    if top_p < 1.0:
        logp, order = torch.log_softmax(x, -1).sort(-1, descending=True)
        probs = logp.exp()
        # drop a token when the mass strictly before it already reaches top_p (the top token stays)
        drop = (probs.cumsum(-1) - probs) >= top_p
        logp = torch.log_softmax(logp.masked_fill(drop, float("-inf")), -1)
        cdf = logp.exp().cumsum(-1)
        total = cdf[:, -1:]
        # strictly below the total, so the searched bin always has positive probability
        target = torch.minimum(uniform.to(cdf)[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
        idx = torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.shape[-1] - 1)
        return order.gather(-1, idx).squeeze(-1), logp.gather(-1, idx).squeeze(-1)
    top = x.amax(-1, keepdim=True)
    weights = torch.exp(x - top)  # unnormalized probabilities, the largest 1
    idx, total = _inverse_cdf(weights, uniform.to(weights))
    return idx, x.gather(-1, idx[:, None]).squeeze(-1) - top.squeeze(-1) - total.log()


def _inverse_cdf(weights: Tensor, uniform: Tensor, block: int = 128) -> tuple[Tensor, Tensor]:
    """``[B]`` token indices ``i`` with ``cdf[i-1] <= u * total < cdf[i]`` over non-negative
    ``[B, V]`` weights, and each row's total ``[B]``; the chosen token always has positive weight.

    Two levels: the cumulative sum of block sums finds the block, a cumsum over its ``block``
    weights the token (``V / block + block`` scanned entries a row instead of ``V``)."""
    b, v = weights.shape
    pad = -v % block
    blocks = (torch.nn.functional.pad(weights, (0, pad)) if pad else weights).view(b, -1, block)
    block_cdf = blocks.sum(-1).cumsum(-1)  # [B, V / block]
    total = block_cdf[:, -1:]
    # strictly below the total, so the searched block and token have positive weight
    target = torch.minimum(uniform[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    j = torch.searchsorted(block_cdf, target, right=True).clamp_(max=block_cdf.shape[-1] - 1)  # [B, 1]
    before = torch.where(j > 0, block_cdf.gather(-1, (j - 1).clamp(min=0)), torch.zeros_like(target))
    inner = blocks.gather(1, j[:, :, None].expand(b, 1, block)).squeeze(1).cumsum(-1)  # [B, block]
    last = inner[:, -1:]
    rest = torch.minimum((target - before).clamp(min=0), torch.nextafter(last, torch.zeros_like(last)))
    i = torch.searchsorted(inner, rest, right=True).clamp_(max=block - 1)
    return (j * block + i).squeeze(-1), total.squeeze(-1)


class _StopStrings:
    """Detects stop strings by decoding the tail of each completion after every step."""

    def __init__(self, tokenizer: Any, stop_strings: tuple[str, ...]) -> None:
        if tokenizer is None:
            raise ValueError("stop_strings need a tokenizer: pass one to GenerationEngine")
        self.tokenizer = tokenizer
        self.stop_strings = stop_strings
        # a token yields at least one byte and a character at most four bytes
        self.window = 4 * max(len(s) for s in stop_strings) + 4

    def hit(self, ids: list[int]) -> bool:
        text = self.tokenizer.decode(ids[-self.window :], skip_special_tokens=False)
        return any(s in text for s in self.stop_strings)
