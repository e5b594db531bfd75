"""Every place the engine reaches into transformers' internals, in one module.

- ``lit_decode_sdpa``: an attention function registered with transformers' `AttentionInterface`
  (and the sdpa mask function under the same name) at import; `_decode_attention` switches a
  model's ``config._attn_implementation`` to it for the duration of a `generate` call.
- `_uncompiled_modules`: modules compiled in place (``module.compile()``) keep their compiled
  forward in ``_compiled_call_impl``; the engine clears it for a call and puts it back.
- `forward_arguments`: the names of the model's cache and logits-to-keep arguments.

Checked against transformers 4.56 to 5.24 (the pyproject's lower bound and the version the
test suite runs on); a transformers release that renames these internals breaks here first.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor
from transformers import AttentionInterface, AttentionMaskInterface


@contextlib.contextmanager
def _uncompiled_modules(model: torch.nn.Module) -> Iterator[None]:
    """Call modules compiled in place (``module.compile()``) uncompiled for a while."""
    compiled = [(m, m._compiled_call_impl) for m in model.modules() if getattr(m, "_compiled_call_impl", None)]
    for m, _ in compiled:
        m._compiled_call_impl = None
    try:
        yield
    finally:
        for m, impl in compiled:
            m._compiled_call_impl = impl


DECODE_ATTENTION = "lit_decode_sdpa"


def decode_attention(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor,
                     attention_mask: Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     **kwargs: Any) -> tuple[Tensor, None]:
    """Attention of the engine's model calls (registered as ``lit_decode_sdpa``): transformers'
    sdpa, except that with grouped KV heads and a mask shared by all heads the ``n`` query tokens
    of a row attend with their queries packed as ``[b, kv_heads, groups * n, d]`` against the
    cache as it is, never a ``repeat_kv`` copy of it. transformers packs only single-token queries
    outside ``torch.compile``: compiled, a decode step copied the whole KV cache once per layer
    (packing made the compiled step 1.4-1.8x faster on an H200), and every prefill of a turn
    copied the batch's cache (7% of a 5-turn CPU rollout)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    n = query.shape[2]
    shared_mask = attention_mask.shape[1] == 1 if attention_mask is not None else n == 1
    if groups == 1 or not shared_mask or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    b, heads, _, dim = query.shape
    if n > 1:  # query rows ordered (group, position) within each KV head: the mask repeats per group
        attention_mask = attention_mask.repeat(1, 1, groups, 1)
    out = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(b, heads // groups, groups * n, dim), key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(b, heads, n, value.shape[-1]).transpose(1, 2).contiguous(), None


AttentionInterface.register(DECODE_ATTENTION, decode_attention)
AttentionMaskInterface.register(DECODE_ATTENTION, AttentionMaskInterface._global_mapping["sdpa"])


@contextlib.contextmanager
def _decode_attention(model: torch.nn.Module) -> Iterator[None]:
    """Models on sdpa attention use `decode_attention` inside the block (`GenerationEngine.generate`)."""
    config = getattr(model.get_base_model() if hasattr(model, "get_base_model") else model, "config", None)
    if config is None or config._attn_implementation != "sdpa":
        yield
        return
    config._attn_implementation = DECODE_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"


def forward_arguments(model: torch.nn.Module) -> tuple[str, bool]:
    """(the name of ``model.forward``'s cache argument, whether it takes ``logits_to_keep``):
    transformers 5.x names the cache ``cache``, older versions ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return ("cache" if "cache" in params else "past_key_values"), "logits_to_keep" in params
