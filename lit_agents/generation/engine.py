"""`GenerationEngine`: batched, KV-cached, token-in/token-out sampling (see the package's doc)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor
from tqdm.auto import tqdm
from transformers import DynamicCache

from lit_agents.generation.hf_patches import _decode_attention, _uncompiled_modules, forward_arguments
from lit_agents.generation.kv_cache import KVContext, _BufferLayer, _extract_contexts, _left_pad_caches
from lit_agents.generation.sampling import SamplingParams, _StopStrings, sample_from_logits


@dataclass
class Completion:
    """One sampled completion.

    Attributes:
        token_ids: the sampled tokens (stop token included when one was sampled).
        logprobs: log-prob of each sampled token under the distribution actually sampled from
            (temperature and top-p renormalization applied). Under greedy decoding
            (temperature 0) the model's log-prob at temperature 1 is reported.
        finish_reason: ``stop`` (stop token or string) or ``length`` (``max_new_tokens`` reached).
        context: the session's handle, to continue it with the next call (a `KVContext` here,
            a `VLLMContext` from the vLLM engine).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    context: Any



@dataclass
class _Batch:
    """The working state of one `generate` call (``b`` rows in the batch, ``B`` sessions)."""

    cache: DynamicCache
    mask: Tensor  # [b, S] 1 on real columns
    next_pos: Tensor  # [b] true position of the next fed token
    rows: Tensor  # [b] session index of each batch row
    live: Tensor  # [b] bool, still sampling

    def select(self, index: Tensor, rows: Tensor) -> None:
        """Keep batch rows ``index``, in that order (a repeated index copies a row); ``rows``:
        the session of each kept row."""
        self.cache.batch_select_indices(index)
        self.mask = self.mask.index_select(0, index)
        self.next_pos = self.next_pos.index_select(0, index)
        self.live = self.live.index_select(0, index)
        self.rows = rows


def _model_forward(engine: GenerationEngine, cache: DynamicCache, ids: Tensor, mask: Tensor, pos: Tensor) -> Tensor:
    """The model call of a static decode step (what ``compile=True`` compiles)."""
    return engine._forward(ids, mask, pos, cache)


class _StaticStep:
    """Decode steps of one batch on fixed buffers, optionally replayed as a CUDA graph.

    The model reads a ``[b, 1, 1, capacity]`` additive mask over the whole cache buffer and each
    layer writes its new key/value at a column held on the device (`_BufferLayer.make_static`), so
    every step has the same shapes and addresses. The first step runs eagerly (on a side stream, as
    CUDA graph warm-up, once per engine), the next captures the step (model call plus sampling)
    and every later one replays it: one launch per token instead of hundreds. Built again after
    the batch is compacted (its buffers are new).
    """

    def __init__(self, engine: GenerationEngine, batch: _Batch, params: SamplingParams) -> None:
        self.engine, self.cache, self.params = engine, batch.cache, params
        self.layers: list[_BufferLayer] = list(batch.cache.layers)
        first = self.layers[0]
        b, filled, device, dtype = batch.rows.numel(), first.filled, batch.mask.device, first._buf_k.dtype
        self.write_at = torch.tensor([filled], device=device)
        for layer in self.layers:
            layer.make_static(self.write_at)
        self.min = torch.finfo(dtype).min
        self.mask = torch.full((b, 1, 1, first.capacity), self.min, dtype=dtype, device=device)
        self.mask[:, 0, 0, :filled].masked_fill_(batch.mask[:, :filled].bool(), 0.0)
        self.ids = torch.zeros(b, 1, dtype=torch.long, device=device)
        self.pos = torch.zeros(b, 1, dtype=torch.long, device=device)
        self.uniform = torch.zeros(b, dtype=torch.float32, device=device)
        self.graphs = engine.decode == "cuda_graph"
        self.graph: torch.cuda.CUDAGraph | None = None
        self.warm = engine._forward_fn is _model_forward  # uncompiled: the engine's warm-up is enough
        self.out: tuple[Tensor, Tensor] | None = None

    def __call__(self, fed: Tensor, live: Tensor, next_pos: Tensor, uniform: Tensor | None) -> tuple[Tensor, Tensor]:
        """Feed ``fed`` (``[b]``) at ``next_pos``; return the sampled tokens and their log-probs."""
        col = self.layers[0].filled
        self.write_at.fill_(col)
        self.mask[:, 0, 0, col] = torch.where(live, 0.0, self.min).to(self.mask.dtype)
        self.ids.copy_(fed[:, None])
        self.pos.copy_(next_pos[:, None])
        if uniform is not None:
            self.uniform.copy_(uniform)
        engine, temperature, top_p = self.engine, self.params.temperature, self.params.top_p

        def step() -> tuple[Tensor, Tensor]:
            logits = engine._forward_fn(engine, self.cache, self.ids, self.mask, self.pos)
            return sample_from_logits(logits, temperature, top_p, self.uniform if temperature > 0 else None)

        if not self.graphs:
            out = step()
        elif not (engine._warm and self.warm):
            # warm-up, eagerly on the side stream: once per engine, and once per batch when
            # compiling (a new shape may recompile, which cannot happen during a capture)
            stream = engine._stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                out = step()
            torch.cuda.current_stream().wait_stream(stream)
            engine._warm = self.warm = True
        else:
            if self.graph is None:
                self.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.graph, pool=engine._graph_pool(), stream=engine._stream()):
                    self.out = step()
            self.graph.replay()
            out = (self.out[0].clone(), self.out[1].clone())
        for layer in self.layers:
            layer.filled += 1
            layer._refresh()
        return out


class GenerationEngine:
    """Batched, KV-cached sampling for many sessions at once (see the module docstring).

    Args:
        model: a Hugging Face causal LM, or a peft ``PeftModel`` around one. Used as given (call
            ``model.eval()`` first; the engine does not change its mode).
        pad_token_id: the token fed on padded positions (always masked out).
        tokenizer: needed only for ``SamplingParams.stop_strings``.
        show_progress: show a tqdm bar over decode steps.
        compact_fraction: drop finished rows from the batch (gathering the cache) once this
            fraction of the batch has finished; until then they are fed masked pads. 0 drops them
            at once, 1 never (only at the end). Results are identical either way; only speed differs.
            ``None``: 0.25, or 0.75 with CUDA graphs, where a smaller batch must be captured again
            (measured on an H200: a capture costs about 20 replayed steps, and a replayed step
            barely depends on the batch size, 3.6 ms at 64 rows and 4.9 ms at 256).
        share_prefill: prefill once for sessions that are in the same state (new, or the same
            handle / a fork of it) and receive the same tokens, e.g. the G samples of one task,
            then copy the cache rows. Same numbers up to floating-point batch effects.
        decode: how decode steps run. ``"dynamic"``: the cache grows by one column per step (the
            fastest on CPU). ``"static"``: fixed shapes and buffers, each step attends over the
            whole cache buffer under a mask. ``"cuda_graph"``: static, and each step (model call
            plus sampling) is captured once per batch as a CUDA graph and replayed, which removes
            the per-layer launch overhead that dominates decoding on a GPU. ``None``: ``cuda_graph``
            on CUDA, else ``dynamic``. Same numbers up to floating-point reduction order.
        compile: ``torch.compile`` the model call of the static decode step (fuses the
            element-wise work between matrix products; the first calls pay the compilation).
            Static and CUDA-graph decode only. Decoder layers compiled in place
            (``AgentPolicy(compile=True)``, for training) are run uncompiled here: with a cache
            their compiled code specializes on the layer index, one recompilation per layer.
        check_every: on static decode, look for a finished batch (a device-to-host sync) every this
            many steps instead of every step; finished rows are fed masked pads meanwhile, so the
            results do not change. 1 where stop strings are used.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        pad_token_id: int,
        tokenizer: Any = None,
        show_progress: bool = False,
        compact_fraction: float | None = None,
        share_prefill: bool = True,
        decode: Literal["dynamic", "static", "cuda_graph"] | None = None,
        compile: bool = False,
        check_every: int = 4,
    ) -> None:
        device = next(model.parameters()).device
        if decode is None:
            decode = "cuda_graph" if device.type == "cuda" else "dynamic"
        if compact_fraction is None:
            compact_fraction = 0.75 if decode == "cuda_graph" else 0.25
        if not 0.0 <= compact_fraction <= 1.0:
            raise ValueError(f"compact_fraction must be in [0, 1], got {compact_fraction}")
        if decode not in ("dynamic", "static", "cuda_graph"):
            raise ValueError(f"decode must be 'dynamic', 'static' or 'cuda_graph', got {decode!r}")
        if decode == "cuda_graph" and device.type != "cuda":
            raise ValueError(f"decode='cuda_graph' needs a model on a CUDA device, not {device.type}")
        if compile and decode == "dynamic":
            raise ValueError("compile=True needs decode='static' or 'cuda_graph' (fixed shapes)")
        if check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {check_every}")
        self.decode, self.check_every = decode, check_every
        # the model call only: sampling's cumsum over a large vocabulary broke inductor (torch 2.11)
        self._forward_fn = torch.compile(_model_forward) if compile else _model_forward
        self._warm = False
        self._side_stream: torch.cuda.Stream | None = None
        self._pool: Any = None
        self.model = model
        self.pad_token_id = pad_token_id
        self.tokenizer = tokenizer
        self.show_progress = show_progress
        self.compact_fraction = compact_fraction
        self.share_prefill = share_prefill
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self._cache_kwarg, self._logits_to_keep = forward_arguments(base)
        config = base.config.get_text_config() if hasattr(base.config, "get_text_config") else base.config
        layer_types = getattr(config, "layer_types", None) or []
        sliding = "sliding_attention" in layer_types
        self._sliding_window: int | None = getattr(config, "sliding_window", None) if sliding else None

    def _stream(self) -> torch.cuda.Stream:
        """The side stream CUDA graphs are warmed up and captured on."""
        if self._side_stream is None:
            self._side_stream = torch.cuda.Stream()
        return self._side_stream

    def _graph_pool(self) -> Any:
        """One memory pool shared by this engine's graphs (they never run at the same time)."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return self._pool

    def fork(self, context: KVContext) -> KVContext:
        """A handle that continues independently of ``context`` (tensors are shared, never mutated)."""
        return dataclasses.replace(context)

    @torch.no_grad()
    def generate(
        self,
        contexts: list[KVContext | None],
        new_ids: list[list[int]],
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> list[Completion]:
        """Sample one completion per session.

        Args:
            contexts: per session, ``None`` to start a new session whose whole prompt is
                ``new_ids[i]``, or a handle from a previous call to continue that session.
            new_ids: per session, the tokens appended before sampling (observation + markup).
            params: the sampling parameters, shared by the batch.
            generator: seeds the sampling (same seed, same inputs: same outputs).

        Returns:
            One `Completion` per session, in order; ``.context`` continues the session.
        """
        if len(contexts) != len(new_ids):
            raise ValueError(f"{len(contexts)} contexts but {len(new_ids)} new_ids")
        if not contexts:
            return []
        with _uncompiled_modules(self.model), _decode_attention(self.model):
            return self._generate(contexts, new_ids, params, generator)

    def _generate(
        self,
        contexts: list[KVContext | None],
        new_ids: list[list[int]],
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> list[Completion]:
        chunks = [
            list(c.pending_ids if c is not None else ()) + list(ids) for c, ids in zip(contexts, new_ids)
        ]
        if any(not chunk for chunk in chunks):
            raise ValueError("a new session needs at least one prompt token")
        stop = _StopStrings(self.tokenizer, params.stop_strings) if params.stop_strings else None
        # sessions in the same state about to read the same tokens (a group's G samples of one
        # task; forks) are prefilled once, then their batch rows are copied
        keys = [(None if c is None else (id(c.keys), c.pending_ids), tuple(ids)) for c, ids in zip(contexts, new_ids)]
        slot: dict[Any, int] = {}  # key -> its row in the shared prefill
        index = [slot.setdefault(key, len(slot)) for key in keys]
        if self.share_prefill and len(slot) < len(keys):
            owners = [index.index(u) for u in range(len(slot))]  # the first session of each row
            batch, logits = self._prefill([contexts[i] for i in owners], [chunks[i] for i in owners],
                                          params.max_new_tokens)
            rows = torch.tensor(index, device=logits.device)
            self._expand(batch, rows)
            logits = logits.index_select(0, rows)
        else:
            batch, logits = self._prefill(contexts, chunks, params.max_new_tokens)
        return self._decode(batch, logits, params, stop, generator)

    @staticmethod
    def _expand(batch: _Batch, index: Tensor) -> None:
        """Copy batch rows: row ``i`` of the result is row ``index[i]`` before, session ``i``."""
        batch.select(index, torch.arange(len(index), device=index.device))

    def _forward(self, input_ids: Tensor, mask: Tensor, position_ids: Tensor, cache: DynamicCache) -> Tensor:
        """One model call on ``[b, n]`` ids; returns the last position's logits ``[b, V]``."""
        kwargs: dict[str, Any] = {self._cache_kwarg: cache, "use_cache": True}
        if self._logits_to_keep:
            # a prefill's last position by index, not as `1`: the model slices [b, 1, H] out of
            # [b, n, H] then, a strided view that makes the output layer a batched matmul over a
            # per-row copy of its weight (5.5x the time on CPU, SmolLM2 at b = 16); the index
            # gathers it contiguously
            n = input_ids.shape[1]
            kwargs["logits_to_keep"] = 1 if n == 1 else torch.tensor([n - 1], device=input_ids.device)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, **kwargs)
        return out.logits[:, -1]

    def _prefill(
        self, contexts: list[KVContext | None], chunks: list[list[int]], max_new: int
    ) -> tuple[_Batch, Tensor]:
        """Stack the caches, prefill the left-padded chunks; return the batch and first logits."""
        device = next(self.model.parameters()).device
        cached = [c.num_cached if c is not None else 0 for c in contexts]
        width, chunk_len = max(cached), max(len(chunk) for chunk in chunks)
        if self._sliding_window is not None and width + chunk_len + max_new > self._sliding_window:
            raise ValueError(
                f"padded batch length {width + chunk_len + max_new} exceeds the model's sliding window "
                f"({self._sliding_window}); the engine supports sliding-window layers only within it"
            )
        ids, pos, mask = [], [], []
        for t, chunk in zip(cached, chunks):
            pad = chunk_len - len(chunk)
            ids.append([self.pad_token_id] * pad + chunk)
            pos.append([0] * pad + list(range(t, t + len(chunk))))
            mask.append([0] * (width - t) + [1] * t + [0] * pad + [1] * len(chunk))
        cache = _left_pad_caches(contexts, width, width + chunk_len + max_new)
        mask_t = torch.tensor(mask, dtype=torch.long, device=device)
        logits = self._forward(
            torch.tensor(ids, device=device), mask_t, torch.tensor(pos, device=device), cache
        )
        n = len(chunks)
        batch = _Batch(
            cache=cache,
            mask=mask_t,
            next_pos=torch.tensor([t + len(c) for t, c in zip(cached, chunks)], device=device),
            rows=torch.arange(n, device=device),
            live=torch.ones(n, dtype=torch.bool, device=device),
        )
        return batch, logits

    def _decode(
        self,
        batch: _Batch,
        logits: Tensor,
        params: SamplingParams,
        stop: _StopStrings | None,
        generator: torch.Generator | None,
    ) -> list[Completion]:
        """Sample step by step until every row has stopped; assemble the completions."""
        n, max_new, device = batch.rows.numel(), params.max_new_tokens, logits.device
        tokens = torch.zeros(n, max_new, dtype=torch.long, device=device)
        logprobs = torch.zeros(n, max_new, dtype=torch.float32, device=device)
        n_gen = torch.zeros(n, dtype=torch.long, device=device)
        stopped = torch.zeros(n, dtype=torch.bool, device=device)
        stop_ids = torch.tensor(params.stop_token_ids, dtype=torch.long, device=device)
        done: dict[int, KVContext] = {}
        history: list[list[int]] = [[] for _ in range(n)]
        bar = tqdm(total=max_new, desc="decode", leave=False, disable=not self.show_progress)
        gen_device = generator.device if generator is not None else device

        def draw() -> Tensor | None:  # one uniform per original session per step, whatever has finished
            if params.temperature == 0:
                return None
            return torch.rand(n, generator=generator, device=gen_device).to(device)[batch.rows]

        static = self.decode != "dynamic"
        check_every = 1 if stop is not None or not static else self.check_every
        can_stop = bool(params.stop_token_ids) or stop is not None  # else every row runs to max_new
        runner: _StaticStep | None = None
        tok, lp = sample_from_logits(logits, params.temperature, params.top_p, draw())
        for step in range(max_new):
            tokens[batch.rows, step], logprobs[batch.rows, step] = tok, lp
            n_gen[batch.rows] += batch.live.long()
            hit = torch.isin(tok, stop_ids) & batch.live
            if stop is not None:
                hit |= self._stop_string_hits(stop, batch, tok, history)
            stopped[batch.rows] |= hit
            batch.live &= ~hit
            bar.update(1)
            if step == max_new - 1:
                break
            fed = torch.where(batch.live, tok, torch.full_like(tok, self.pad_token_id))
            keep = None
            if can_stop and (step + 1) % check_every == 0:  # a device-to-host sync
                n_live = int(batch.live.sum())
                if n_live == 0:
                    break
                keep = self._maybe_compact(batch, n_live, tokens, n_gen, done)
            if keep is not None:
                fed, runner = fed.index_select(0, keep), None
            uniform = draw()
            batch.mask = torch.cat([batch.mask, batch.live.long()[:, None]], dim=1)
            if static:
                if runner is None:  # reads the mask's columns already in the cache
                    runner = _StaticStep(self, batch, params)
                tok, lp = runner(fed, batch.live, batch.next_pos, uniform)
            else:
                logits = self._forward(fed[:, None], batch.mask, batch.next_pos[:, None], batch.cache)
                tok, lp = sample_from_logits(logits, params.temperature, params.top_p, uniform)
            batch.next_pos += batch.live.long()
        bar.close()
        self._extract_rows(batch, torch.ones_like(batch.live), tokens, n_gen, done)
        return self._completions(tokens, logprobs, n_gen, stopped, done)

    @staticmethod
    def _stop_string_hits(stop: _StopStrings, batch: _Batch, tok: Tensor, history: list[list[int]]) -> Tensor:
        """``[b]`` bool: live rows whose completion now contains a stop string."""
        hits = []
        for row, t, live in zip(batch.rows.tolist(), tok.tolist(), batch.live.tolist()):
            if live:
                history[row].append(t)
            hits.append(live and stop.hit(history[row]))
        return torch.tensor(hits, dtype=torch.bool, device=tok.device)

    def _maybe_compact(
        self, batch: _Batch, n_live: int, tokens: Tensor, n_gen: Tensor, done: dict[int, KVContext]
    ) -> Tensor | None:
        """Drop finished rows once ``compact_fraction`` of the batch has finished; return the kept rows."""
        finished = batch.live.numel() - n_live
        if finished == 0 or finished < self.compact_fraction * batch.live.numel():
            return None
        self._extract_rows(batch, ~batch.live, tokens, n_gen, done)
        keep = batch.live.nonzero().squeeze(-1)
        batch.select(keep, batch.rows.index_select(0, keep))
        return keep

    @staticmethod
    def _extract_rows(
        batch: _Batch, select: Tensor, tokens: Tensor, n_gen: Tensor, done: dict[int, KVContext]
    ) -> None:
        """Store a dense handle for every selected batch row (keyed by session index)."""
        rows, n_last = batch.rows.tolist(), n_gen[batch.rows].tolist()
        last = tokens[batch.rows, (n_gen[batch.rows] - 1).clamp(min=0)].tolist()
        picked = [j for j in select.nonzero().squeeze(-1).tolist() if rows[j] not in done]
        if not picked:
            return
        assert all(n_last[j] > 0 for j in picked)
        index = torch.tensor(picked, device=batch.mask.device)
        contexts = _extract_contexts(batch.cache, index, batch.mask.bool().index_select(0, index),
                                     [last[j] for j in picked])
        for j, context in zip(picked, contexts):
            done[rows[j]] = context

    @staticmethod
    def _completions(
        tokens: Tensor, logprobs: Tensor, n_gen: Tensor, stopped: Tensor, done: dict[int, KVContext]
    ) -> list[Completion]:
        out = []
        for i, (ids, lps, n, s) in enumerate(
            zip(tokens.tolist(), logprobs.tolist(), n_gen.tolist(), stopped.tolist())
        ):
            out.append(Completion(ids[:n], lps[:n], "stop" if s else "length", done[i]))
        return out
