"""Per-session KV caches: the opaque `KVContext` handle a caller passes back to continue a
session, and the cache layer a `generate` call decodes into (a buffer sized for the whole call),
left-padded from many contexts and gathered back into dense ones afterwards.

`_BufferLayer` subclasses transformers' `DynamicLayer` (its ``lazy_initialization``, ``update``,
``get_seq_length``, ``batch_select_indices``): checked against transformers 4.56 to 5.24.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


@dataclass(frozen=True, eq=False)
class KVContext:
    """Opaque handle to one session's state; pass it back to `GenerationEngine.generate`.

    The tensors are never modified in place (every call builds new ones), so handles can share
    them: `GenerationEngine.fork` is free.

    Attributes:
        keys: per layer ``[1, kv_heads, T, head_dim]``, true positions ``0..T-1``.
        values: per layer, same shapes as ``keys``.
        pending_ids: tokens of the session not yet in the cache (the last sampled token).
    """

    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]
    pending_ids: tuple[int, ...] = ()

    @property
    def num_cached(self) -> int:
        """Tokens held in the cache."""
        return self.keys[0].shape[-2] if self.keys else 0

    @property
    def num_tokens(self) -> int:
        """Length of the session so far (cached plus pending tokens)."""
        return self.num_cached + len(self.pending_ids)



class _BufferLayer(DynamicLayer):
    """A cache layer written into a buffer sized for the whole call: no concatenation per step.

    ``keys``/``values`` are views of the filled part, ``[b, kv_heads, filled, head_dim]``; the
    buffer past it is uninitialized and never read.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity, self.filled = capacity, 0
        self.write_at: Tensor | None = None  # static mode: ``[1]`` column to write, read on the device

    def make_static(self, write_at: Tensor) -> None:
        """Static mode (for CUDA graphs): ``update`` writes one column at ``write_at`` and returns
        the whole buffer, so shapes and addresses stay fixed; the caller advances ``filled``."""
        self._buf_k[..., self.filled :, :].zero_()  # read under a mask: must be finite (0 * nan = nan)
        self._buf_v[..., self.filled :, :].zero_()
        self.write_at = write_at

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        b, _, _, dim = key_states.shape
        self._buf_k = key_states.new_empty(b, key_states.shape[1], self.capacity, dim)
        self._buf_v = value_states.new_empty(b, value_states.shape[1], self.capacity, value_states.shape[-1])

    def _refresh(self) -> None:
        self.keys = self._buf_k[..., : self.filled, :]
        self.values = self._buf_v[..., : self.filled, :]

    def fill_rows(
        self, keys: list[Tensor | None], values: list[Tensor | None], width: int, at: tuple[Tensor, Tensor]
    ) -> None:
        """Write per-session ``[1, kv_heads, T_i, head_dim]`` caches right-aligned in ``width``
        columns; ``at`` = (batch row, column) of each written position, session by session."""
        ref = next(i for i, k in enumerate(keys) if k is not None)
        b = len(keys)
        self.lazy_initialization(keys[ref].expand(b, -1, -1, -1), values[ref].expand(b, -1, -1, -1))
        for buf, parts in ((self._buf_k, keys), (self._buf_v, values)):
            buf[:, :, :width].zero_()  # pads must be finite: masked weights are 0, and 0 * nan = nan
            # one copy for the whole batch: [sum T_i, kv_heads, head_dim] into the rows' columns
            buf[at[0], :, at[1]] = torch.cat([p[0].transpose(0, 1) for p in parts if p is not None])
        self.filled = width
        self._refresh()

    def update(
        self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any
    ) -> tuple[Tensor, Tensor]:
        if self.write_at is not None:
            self._buf_k.index_copy_(2, self.write_at, key_states)
            self._buf_v.index_copy_(2, self.write_at, value_states)
            return self._buf_k, self._buf_v
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        if self.filled + n > self.capacity:
            raise RuntimeError(f"cache buffer overflow ({self.filled} + {n} > {self.capacity})")
        self._buf_k[..., self.filled : self.filled + n, :] = key_states
        self._buf_v[..., self.filled : self.filled + n, :] = value_states
        self.filled += n
        self._refresh()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.filled

    def batch_select_indices(self, indices: Tensor) -> None:
        if self.is_initialized:
            self._buf_k = self._buf_k.index_select(0, indices)
            self._buf_v = self._buf_v.index_select(0, indices)
            self._refresh()


def _left_pad_caches(contexts: list[KVContext | None], width: int, capacity: int) -> DynamicCache:
    """Stack per-session caches into one batch cache, right-aligned in ``width`` columns.

    The cache has room for ``capacity`` columns in all (prefill and decode included).
    """
    cache = DynamicCache()
    cache.layer_class_to_replicate = functools.partial(_BufferLayer, capacity)
    if width == 0:
        return cache
    live = [c if c is not None and c.num_cached > 0 else None for c in contexts]
    num_layers = len(next(c for c in live if c is not None).keys)
    device = next(c for c in live if c is not None).keys[0].device
    rows = [i for i, c in enumerate(live) if c is not None for _ in range(c.num_cached)]
    cols = [col for c in live if c is not None for col in range(width - c.num_cached, width)]
    at = (torch.tensor(rows, device=device), torch.tensor(cols, device=device))
    for layer_idx in range(num_layers):
        layer = _BufferLayer(capacity)
        layer.fill_rows(
            [c.keys[layer_idx] if c is not None else None for c in live],
            [c.values[layer_idx] if c is not None else None for c in live],
            width,
            at,
        )
        cache.layers.append(layer)
    return cache


def _extract_contexts(cache: DynamicCache, index: Tensor, mask: Tensor, pending: list[int]) -> list[KVContext]:
    """Gather the real columns of batch rows ``index`` into dense single-session handles.

    One gather per layer for all rows (``mask``: ``[k, S]`` bool, the real columns of those
    ``k`` rows); each handle's tensors are views of it, ``[1, kv_heads, T_i, head_dim]``.
    """
    row, col = mask.nonzero(as_tuple=True)  # row by row, columns in order
    row = index[row]
    lengths = mask.sum(1).tolist()

    def split(buf: Tensor) -> list[Tensor]:
        return [p.transpose(0, 1).unsqueeze(0) for p in buf[row, :, col].split(lengths)]

    keys = [split(layer.keys) for layer in cache.layers]
    values = [split(layer.values) for layer in cache.layers]
    return [KVContext(keys=tuple(k[i] for k in keys), values=tuple(v[i] for v in values), pending_ids=(last,))
            for i, last in enumerate(pending)]
