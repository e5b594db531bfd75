"""The rollout engine: batched, KV-cached, token-in/token-out sampling for many agent sessions.

Modules: `sampling` (settings, inverse-CDF sampling), `kv_cache` (per-session contexts, the
call's cache buffer), `engine` (`GenerationEngine`), `hf_patches` (every reach into
transformers' internals, with the versions it was checked against), `vllm_engine` (`VLLMEngine`:
the same interface served by vLLM, chosen with ``AgentPolicy(engine="vllm")``).

Agent loops step many episodes in lock-step. Each turn every live session appends its new tokens
(an environment observation plus chat markup) and samples a completion. `GenerationEngine` is
stateless: each session's key/value cache lives in an opaque `KVContext` handle that the caller
passes back to continue the session, so only the new tokens are ever prefilled.

How a call works:

1. Every session's cache is dense on its own (per layer ``[1, kv_heads, T_i, head_dim]``, true
   positions ``0..T_i-1``). For a batch, caches are left-padded to the longest and stacked; the new
   tokens are left-padded within their chunk, so every row's last column is a real token. A 2D
   attention mask (0 on pads) and explicit ``position_ids`` (true positions) make the padding
   invisible: RoPE and learned absolute positions see the same numbers as an unpadded pass.
2. The chunk is prefilled (``logits_to_keep=1``), then all unfinished rows decode step by step
   into a cache buffer sized for the whole call (no concatenation per step). A finished row is
   fed a masked pad until ``compact_fraction`` of the batch has finished, then the batch is
   compacted with ``index_select``; both keep the other rows exact.
3. Afterwards each row's real columns are gathered back into a dense per-session cache (one
   gather per layer for the whole batch). The last sampled token is not in the cache yet: the
   handle keeps it as ``pending_ids`` and the next call feeds it ahead of the new tokens.

On a GPU, decode steps run on fixed shapes instead (``decode="cuda_graph"``, the default there):
each step attends over the whole cache buffer under a ``[b, 1, 1, capacity]`` mask and writes its
key/value at a column held on the device, so the step (model call and sampling) is captured once
as a CUDA graph and replayed for every token; ``compile=True`` also compiles the model call.

Sampling uses one uniform number per session per step (inverse-CDF sampling), drawn for the whole
original batch every step, so a seeded ``torch.Generator`` gives identical results run to run and
the random stream does not depend on which rows have already finished.

Limitations: attention-only decoders whose cache is a list of key/value tensors (Llama, Qwen2,
Mistral, GPT-2, ...); not recurrent/linear-attention hybrids. Sliding-window layers are exact only
while the padded batch fits in the window (checked: longer batches raise a ``ValueError``).
"""

from lit_agents.generation.engine import Completion, GenerationEngine
from lit_agents.generation.hf_patches import DECODE_ATTENTION, decode_attention
from lit_agents.generation.kv_cache import KVContext
from lit_agents.generation.sampling import SamplingParams, sample_from_logits
from lit_agents.generation.vllm_engine import VLLMContext, VLLMEngine, VLLMSettings

__all__ = ["DECODE_ATTENTION", "Completion", "GenerationEngine", "KVContext", "SamplingParams", "VLLMContext",
           "VLLMEngine", "VLLMSettings", "decode_attention", "sample_from_logits"]
