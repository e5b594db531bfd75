"""AgentPolicy: a Hugging Face causal LM, its tokenizer and chat format, and named LoRA roles.

One backbone serves every role (Multi2's planner and executor, a frozen reference): each role
is a peft LoRA adapter, activated by name. The KL reference is free: the base with adapters
disabled, or a frozen snapshot adapter. With ``finetune="full"`` every weight trains instead
(used to train the embedded default from scratch) and the reference is the frozen copy a
`KLAnchor` callback keeps.

Models load by short name (`lit_agents.models.KNOWN_MODELS`), local folder, GGUF file or hub
id; ``"tiny"`` is the embedded default (`lit_agents.tiny`). bf16 on GPU, fp32 on CPU; a 4-bit
base through bitsandbytes on a CUDA GPU.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lit_agents.algorithms.collate import MIN_SHARED_PREFIX, PrefixPlan, shared_prefix_plan
from lit_agents.algorithms.losses import token_logprobs, token_logprobs_and_entropy
from lit_agents.generation.hf_patches import forward_arguments
from lit_agents.generation.vllm_engine import VLLMEngine, VLLMSettings, require_vllm
from lit_agents.models import ModelSource, load_pretrained, resolve_model
from lit_agents.tiny import TinyConfig, embedded_default

#: Attention projections by naming convention (Llama/Qwen/Mistral, GPT-2, GPT-NeoX/Falcon).
ATTENTION_PROJECTIONS = (("q_proj", "k_proj", "v_proj", "o_proj"), ("c_attn",), ("query_key_value",))

#: Used where a tokenizer has no chat template: role headers and the EOS token closing each turn.
FALLBACK_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


class ChatFormat:
    """Token ids of a conversation, built turn by turn from the tokenizer's chat template.

    The agent loop never re-tokenizes earlier turns: `start` gives the first prompt, `next` the
    ids that follow a sampled completion (which ended with `end_id`) up to the next generation
    prompt, and `completion` the ids of a demonstration action. Pieces are split at special
    tokens, so concatenating them equals tokenizing the rendered conversation.
    """

    _MARK = "\x00MARK\x00"

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        if tokenizer.chat_template is None:
            if tokenizer.eos_token is None:
                raise ValueError("tokenizer has neither a chat template nor an EOS token")
            tokenizer.chat_template = FALLBACK_TEMPLATE
        self.tokenizer = tokenizer
        probe = [{"role": "user", "content": "u"}, {"role": "assistant", "content": self._MARK}]
        text = self._render(probe, add_generation_prompt=False)
        after = text[text.index(self._MARK) + len(self._MARK) :]
        after_ids = self._encode(after)
        if not after_ids or after_ids[0] not in tokenizer.all_special_ids:
            raise ValueError(
                "the chat template does not close an assistant turn with a special token; "
                f"after the assistant text it renders {after!r}"
            )
        self.end_id: int = after_ids[0]
        self._trailer = after_ids[1:]
        self._probe_text = text

    def _render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return (self.end_id,)

    def start(self, system: str, user: str) -> list[int]:
        """Ids of the first prompt (system + user message + generation prompt)."""
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": user})
        try:
            text = self._render(messages, add_generation_prompt=True)
        except Exception:  # templates without a system role: fold it into the user message
            text = self._render(
                [{"role": "user", "content": f"{system}\n\n{user}"}], add_generation_prompt=True
            )
        return self._encode(text)

    def next(self, user: str) -> list[int]:
        """Ids after a completion that ended with `end_id`: trailer + user message + generation prompt."""
        base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": self._MARK}]
        more = self._render(base + [{"role": "user", "content": user}], add_generation_prompt=True)
        return self._trailer + self._encode(more[len(self._probe_text) :])

    def completion(self, text: str) -> list[int]:
        """Ids of an assistant message as the policy would sample it (text + end token)."""
        return self._encode(text) + [self.end_id]

    def decode_completion(self, ids: list[int]) -> str:
        """The action text of a sampled completion (special tokens dropped, whitespace stripped)."""
        return self.tokenizer.decode(ids, skip_special_tokens=True).strip()


@contextlib.contextmanager
def _quiet_peft_and_bnb() -> Iterator[None]:
    """Around peft's import, its wrapping of a model and a 4-bit load, drop two third-party
    notices that say nothing to this library's users (everything else still shows):

    - bitsandbytes, which peft and a 4-bit load import, logs on its first import on a CPU with
      AVX512-BF16 and without the ``kernels`` package that it could not fetch a CPU 4-bit kernel
      from the Hub; 4-bit bases run on CUDA only here (``load_in_4bit``).
    - peft reads transformers' deprecated ``is_gradient_checkpointing`` when it wraps a model
      (a FutureWarning about peft's code).
    """
    bnb_log = logging.getLogger("bitsandbytes.backends.cpu.ops")

    def keep(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Failed to load CPU gemm_4bit_forward")

    bnb_log.addFilter(keep)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
            yield
    finally:
        bnb_log.removeFilter(keep)


def _torch_dtype(dtype: str) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if torch.cuda.is_available() else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def default_lora_targets(model: nn.Module) -> list[str]:
    """All attention projections of the model, by naming convention [choice: docs/algorithms.md, Multi2]."""
    names = {name.rsplit(".", 1)[-1] for name, mod in model.named_modules() if isinstance(mod, nn.Linear)}
    names |= {name.rsplit(".", 1)[-1] for name, mod in model.named_modules() if type(mod).__name__ == "Conv1D"}
    for group in ATTENTION_PROJECTIONS:
        found = [n for n in group if n in names]
        if found:
            return found
    raise ValueError(f"no known attention projections in {type(model).__name__}; set lora_targets")


def role_folders(folder: str | Path) -> dict[str, Path]:
    """role -> adapter folder under ``folder``, the layout `AgentPolicy.save_role` (and so
    `LoRACheckpoint`) writes: one sub-folder per role holding ``adapter_config.json``."""
    return {d.name: d for d in sorted(Path(folder).glob("*")) if (d / "adapter_config.json").exists()}


def _layer_shape(layer: nn.Module) -> tuple[int, int] | None:
    """(in, out) features of a layer LoRA adapts: a linear layer, or GPT-2's Conv1D."""
    layer = layer.get_base_layer() if hasattr(layer, "get_base_layer") else layer
    if isinstance(layer, nn.Linear):
        return layer.in_features, layer.out_features
    weight = getattr(layer, "weight", None)
    if type(layer).__name__ == "Conv1D" and weight is not None:
        return int(weight.shape[0]), int(weight.shape[1])
    return None


def check_adapter_fits(model: nn.Module, folder: str | Path) -> None:
    """Raise a ValueError naming both models unless every LoRA matrix saved in ``folder`` (peft's
    ``adapter_model.safetensors``) fits the layer of ``model`` it adapts: an adapter trained on
    another base would otherwise fail inside peft with one size mismatch per matrix."""
    import json

    from safetensors import safe_open

    folder = Path(folder)
    weights = folder / "adapter_model.safetensors"
    if not weights.is_file():
        return
    trained_on = json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path")
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    here = getattr(getattr(base, "config", None), "_name_or_path", "") or type(base).__name__
    with safe_open(str(weights), "pt") as f:
        for key in f.keys():
            path, _, kind = key.partition(".lora_")
            if kind not in ("A.weight", "B.weight"):
                continue
            shape = f.get_slice(key).get_shape()
            try:
                features = _layer_shape(base.get_submodule(path.removeprefix("base_model.model.")))
            except AttributeError:
                features = None
            a_matrix = kind == "A.weight"  # A is [r, in], B is [out, r]
            if features is not None and (shape[1] if a_matrix else shape[0]) == features[0 if a_matrix else 1]:
                continue
            layer = "no such layer" if features is None else f"a {features[0]} -> {features[1]} layer"
            raise ValueError(f"adapter {folder} was trained on {trained_on!r}, but this config loads {here!r}: "
                             f"{key} is {tuple(shape)} in the adapter, {layer} here")


def _merged(base: nn.Module, adapter: str, load_in_4bit: bool) -> nn.Module:
    """``base`` with the saved peft ``adapter`` folded into its weights (`AgentPolicy(merge_adapter)`)."""
    with _quiet_peft_and_bnb():
        from peft import PeftModel

    if load_in_4bit:
        raise ValueError("merge_adapter folds the adapter into the weights, which a 4-bit base cannot hold "
                         "exactly: merge on a full-precision load, save it (AgentPolicy.save_pretrained) and load "
                         "that in 4 bits")
    folder = Path(adapter)
    if not (folder / "adapter_config.json").exists():
        roles = list(role_folders(folder))
        hint = f"; it holds the role folders {roles}: name one, e.g. {folder / roles[0]}" if roles else ""
        raise FileNotFoundError(f"merge_adapter: no peft adapter at {folder} (adapter_config.json missing){hint}")
    check_adapter_fits(base, folder)
    with _quiet_peft_and_bnb():
        return PeftModel.from_pretrained(base, str(folder)).merge_and_unload()


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The stack of transformer blocks of a causal LM (``layers`` of Llama/Qwen2/Mistral, ``h`` of GPT-2)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    for name in ("layers", "h", "blocks", "block"):
        if isinstance(getattr(decoder, name, None), nn.ModuleList):
            return getattr(decoder, name)
    raise ValueError(f"cannot find the decoder layers of {type(model).__name__}")


def _enable_checkpointing(model: PreTrainedModel) -> None:
    """Activation checkpointing, non-reentrant (LoRA's frozen inputs need it), under the name the
    installed transformers has: ``activation_checkpointing_enable`` where it exists (5.24 has it),
    else ``gradient_checkpointing_enable``, which newer releases deprecate and v6 removes."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


class AgentPolicy(nn.Module):
    """A causal LM with a chat format and named LoRA roles.

    Args:
        model: ``"tiny"`` (the embedded default), a short name from
            `lit_agents.models.KNOWN_MODELS` (e.g. ``"smollm2-135m"``), a local folder, a
            ``.gguf`` file or a hub id.
        tiny: size of the embedded default (only with ``model="tiny"``).
        merge_adapter: a saved peft adapter (the folder with ``adapter_config.json``, e.g. a LoRA
            SFT run's ``adapters/last/default``) merged into the base weights at load: a stage
            that starts from a LoRA-trained model (RL after LoRA SFT) trains fresh roles on top,
            and the KL reference ``base`` (adapters disabled) is that merged model.
        finetune: ``"lora"`` trains one adapter per role on a frozen base; ``"full"`` trains
            every weight (for small models trained from scratch).
        roles: adapter names to create (LoRA only). The first is active after construction.
        adapters: role -> folder of a saved peft adapter to start that role from (trainable).
        frozen_adapters: role -> folder of a saved peft adapter loaded frozen (an earlier stage's
            role that this stage uses but does not train, or a KL reference).
        lora_r: LoRA rank.
        lora_alpha: LoRA alpha.
        lora_dropout: LoRA dropout.
        lora_targets: module names to adapt; ``None`` = all attention projections,
            ``"all-linear"`` = every linear layer but the output head.
        dtype: ``"auto"`` = bf16 on GPU, fp32 on CPU.
        load_in_4bit: 4-bit NF4 base through bitsandbytes (QLoRA); needs a CUDA GPU.
        attn_implementation: ``"sdpa"``, ``"eager"``, ``"flash_attention_2"``...
        gradient_checkpointing: recompute activations in backward to save memory.
        logprob_chunk_size: positions per chunk when computing log-probs (bounds the logits memory).
        compile: ``torch.compile`` each decoder layer in place (parameter names unchanged) for
            training steps: fuses the element-wise work between matrix products. Rollouts run
            the layers uncompiled; on a GPU the engine compiles its whole decode step instead
            (`GenerationEngine(compile=True)`). Pays on a GPU after the first steps
            (compilation); on CPU it rarely does.
        engine: what samples the rollouts: ``"builtin"`` (`GenerationEngine` over this model, the
            default: the fastest on a CPU and for the embedded default) or ``"vllm"`` (`VLLMEngine`,
            a vLLM engine in this process that is sent the trained weights before each batch of
            rollouts: for GPUs, larger models, tensor parallelism; docs/engines.md).
        vllm: the vLLM engine's settings (`VLLMSettings`), with ``engine: vllm``.
        share_prefix: in a training batch, rows that begin with the same tokens up to before
            their first trained token (the G samples of one task share its prompt) run that
            prefix once and attend to its cached keys and values (`hidden_states`); exact up to
            float rounding, gradients included. Only where it saves compute, never under active
            dropout (one prefix pass would share one dropout mask), gradient checkpointing, FSDP or
            sliding-window attention.
    """

    def __init__(
        self,
        model: str = "tiny",
        tiny: TinyConfig | None = None,
        merge_adapter: str | None = None,
        finetune: Literal["lora", "full"] = "lora",
        roles: list[str] | None = None,
        adapters: dict[str, str] | None = None,
        frozen_adapters: dict[str, str] | None = None,
        lora_r: int = 16,
        lora_alpha: int = 32,
        lora_dropout: float = 0.05,
        lora_targets: list[str] | str | None = None,
        dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto",
        load_in_4bit: bool = False,
        attn_implementation: str | None = "sdpa",
        gradient_checkpointing: bool = False,
        logprob_chunk_size: int = 1024,
        compile: bool = False,
        share_prefix: bool = True,
        engine: Literal["builtin", "vllm"] = "builtin",
        vllm: VLLMSettings | None = None,
    ) -> None:
        super().__init__()
        if engine not in ("builtin", "vllm"):
            raise ValueError(f"engine must be 'builtin' or 'vllm', got {engine!r}")
        if vllm is not None and engine != "vllm":
            raise ValueError("vllm settings apply to engine: vllm only")
        if engine == "vllm":
            require_vllm()  # before the model loads: a missing package fails at once
        self.engine, self.vllm_settings = engine, vllm or VLLMSettings()
        self._vllm: VLLMEngine | None = None
        if tiny is not None and model != "tiny":
            raise ValueError(f"`tiny` sizes the embedded default only, but model={model!r}")
        if finetune == "full" and (roles or adapters or frozen_adapters or load_in_4bit):
            raise ValueError("finetune='full' trains the whole model: roles, adapters and load_in_4bit do not apply")
        self.name = model
        self.finetune = finetune
        self.logprob_chunk_size = logprob_chunk_size
        self.lora_settings = dict(r=lora_r, lora_alpha=lora_alpha, lora_dropout=lora_dropout, targets=lora_targets)
        #: where the weights came from, whether an adapter was merged in, 4-bit: what a vLLM engine loads
        self.source = ModelSource(embedded_default(tiny)) if model == "tiny" else resolve_model(model)
        self.merged_from, self.load_in_4bit = merge_adapter, load_in_4bit
        base, self.tokenizer = self._load(self.source, dtype, load_in_4bit, attn_implementation)
        if merge_adapter is not None:
            base = _merged(base, merge_adapter, load_in_4bit)
        self.gradient_checkpointing = gradient_checkpointing
        if gradient_checkpointing:
            _enable_checkpointing(base)
        self.compiled = compile
        self.share_prefix = share_prefix
        if compile:
            for layer in decoder_layers(base):
                layer.compile()
        self.chat = ChatFormat(self.tokenizer)
        self.model: nn.Module = base.train()  # from_pretrained returns eval mode; Lightning switches modes
        if finetune == "lora" and not lora_targets:
            self.lora_settings["targets"] = default_lora_targets(base)
        self._roles: list[str] = []
        if finetune == "lora":
            for role in roles or ([] if adapters or frozen_adapters else ["default"]):
                self.add_role(role)
            for role, path in (adapters or {}).items():
                self.load_role(role, path, trainable=True)
            for role, path in (frozen_adapters or {}).items():
                self.load_role(role, path, trainable=False)
            self.set_role(self._roles[0])

    # ----------------------------------------------------------------------------- loading
    @staticmethod
    def _load(source: ModelSource, dtype: str, load_in_4bit: bool, attn: str | None):
        quantization = None
        if load_in_4bit:
            if not torch.cuda.is_available():
                raise ValueError(
                    "load_in_4bit needs a CUDA GPU: bitsandbytes' 4-bit base runs on GPU only. "
                    "Set load_in_4bit: false to train in full precision on this machine."
                )
            from transformers import BitsAndBytesConfig

            quantization = BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type="nf4",
                bnb_4bit_compute_dtype=torch.bfloat16,
                bnb_4bit_use_double_quant=True,
            )
        with _quiet_peft_and_bnb():  # a 4-bit load imports bitsandbytes
            return load_pretrained(
                source, dtype=_torch_dtype(dtype), quantization_config=quantization, attn_implementation=attn
            )

    # ----------------------------------------------------------------------------- roles
    @property
    def roles(self) -> list[str]:
        return list(self._roles)

    @property
    def active_role(self) -> str | None:
        return getattr(self.model, "active_adapter", None) if self._roles else None

    def add_role(self, role: str, trainable: bool = True) -> None:
        """Add a fresh LoRA adapter named ``role``."""
        with _quiet_peft_and_bnb():
            from peft import LoraConfig, PeftModel, get_peft_model

        if self.finetune != "lora":
            raise ValueError("roles need finetune='lora'")
        if role in self._roles:
            raise ValueError(f"role {role!r} exists already")
        s = self.lora_settings
        config = LoraConfig(
            r=s["r"],
            lora_alpha=s["lora_alpha"],
            lora_dropout=s["lora_dropout"],
            target_modules=s["targets"],
            task_type="CAUSAL_LM",
        )
        if isinstance(self.model, PeftModel):
            self.model.add_adapter(role, config)
        else:
            with _quiet_peft_and_bnb():
                self.model = get_peft_model(self.model, config, adapter_name=role)
        self._roles.append(role)
        self._set_trainable(role, trainable)

    def load_role(self, role: str, path: str | Path, trainable: bool = False) -> None:
        """Load a saved peft adapter as ``role`` (replacing an existing role of that name, which
        stays active if it was)."""
        with _quiet_peft_and_bnb():
            from peft import PeftModel

        path = str(path)
        if not (Path(path) / "adapter_config.json").exists():
            raise FileNotFoundError(f"no peft adapter at {path} (adapter_config.json missing)")
        check_adapter_fits(self.model, path)
        was_active = role == self.active_role
        if role in self._roles:
            self.model.delete_adapter(role)
            self._roles.remove(role)
        if isinstance(self.model, PeftModel):
            self.model.load_adapter(path, adapter_name=role, is_trainable=trainable)
        else:
            with _quiet_peft_and_bnb():
                self.model = PeftModel.from_pretrained(self.model, path, adapter_name=role, is_trainable=trainable)
        self._roles.append(role)
        self._set_trainable(role, trainable)
        if was_active:  # replacing the active role: forward passes go through the loaded weights
            self.set_role(role)

    def _set_trainable(self, role: str, trainable: bool) -> None:
        for name, param in self.model.named_parameters():
            if f".{role}." in name and "lora_" in name:
                param.requires_grad_(trainable)

    def set_role(self, role: str) -> None:
        """Route forward passes through adapter ``role`` (keeps each role's trainable flags)."""
        if role not in self._roles:
            raise KeyError(f"unknown role {role!r}; roles: {self._roles}")
        flags = {n: p.requires_grad for n, p in self.model.named_parameters()}
        self.model.set_adapter(role)
        for name, param in self.model.named_parameters():  # peft's set_adapter resets these
            param.requires_grad_(flags[name])

    @contextlib.contextmanager
    def adapters_disabled(self) -> Iterator[None]:
        """The frozen base model: the free KL reference under LoRA."""
        if not self._roles:
            raise ValueError("no adapters to disable (finetune='full')")
        with self.model.disable_adapter():
            yield

    @contextlib.contextmanager
    def merged_adapter(self) -> Iterator[bool]:
        """Generation with the adapter folded into the weights: each adapted layer's base weight
        is replaced by ``W + scale * B @ A`` (peft's ``get_delta_weight``) and the adapters are
        bypassed, one matrix product a layer instead of three; on exit the original weight
        tensors are put back as they were (nothing is added to or subtracted from them). Yields
        whether it merged, which it does only where the merged model is the policy that trains:
        eval mode, one role (a loop that switches roles mid-rollout needs live adapters), float32
        weights outside autocast (in bf16, rounding ``W + delta`` would swallow most of a small
        delta), no adapted weight shared with another layer (tied embeddings), nothing sharded.
        Costs one copy of the adapted weights while it lasts (`GenerationEngine` users: the data
        modules' rollouts and evaluation enter it)."""
        layers = self._mergeable_layers()
        if not layers:
            yield False
            return
        originals = []
        try:
            with torch.no_grad():
                for layer in layers:
                    weight = layer.get_base_layer().weight
                    merged = weight.data + layer.get_delta_weight(self.active_role).to(weight.dtype)
                    originals.append((weight, weight.data))
                    weight.data = merged
            with self.adapters_disabled():
                yield True
        finally:
            for weight, data in originals:
                weight.data = data

    def _mergeable_layers(self) -> list[nn.Module]:
        """The LoRA layers `merged_adapter` would fold, or [] where it must not."""
        if self.training or len(self._roles) != 1 or self.active_role != self._roles[0] or self.engine != "builtin":
            return []  # (a vLLM engine samples from its own copy of the weights)
        with _quiet_peft_and_bnb():
            from peft.tuners.lora import LoraLayer

        role = self.active_role
        layers = [m for m in self.model.modules() if isinstance(m, LoraLayer) and role in m.lora_A]
        if any(layer.use_dora.get(role) or getattr(layer, "lora_bias", {}).get(role) for layer in layers):
            return []  # DoRA rescales the merged weight; a LoRA bias is not in the delta
        weights = [layer.get_base_layer().weight for layer in layers]
        if not layers or any(type(w) is not nn.Parameter or w.dtype != torch.float32 for w in weights):
            return []  # quantized (bitsandbytes), sharded (DTensor) or low-precision weights
        if any(torch.is_autocast_enabled(w.device.type) for w in weights[:1]):
            return []
        owners: dict[int, int] = {}
        for _, param in self.model.named_parameters(remove_duplicate=False):
            owners[id(param)] = owners.get(id(param), 0) + 1
        if any(owners.get(id(w), 0) != 1 for w in weights):
            return []  # tied: folding the head's delta would change the embedding too
        return layers

    # ----------------------------------------------------------------------------- engines
    def vllm_engine(self, show_progress: bool = False) -> VLLMEngine:
        """The vLLM engine of ``engine: vllm`` (started on first use, one per process), awake."""
        if self.engine != "vllm":
            raise ValueError(f"this policy samples with engine {self.engine!r}, not vllm")
        if self._vllm is None:
            self._vllm = VLLMEngine(self, self.vllm_settings, show_progress)
        self._vllm.wake()
        return self._vllm

    def sleep_engine(self) -> None:
        """Give the rollout engine's memory back for the update (vLLM's sleep mode, where it is on)."""
        if self._vllm is not None:
            self._vllm.sleep()

    def engine_stats(self) -> dict[str, float]:
        """The rollout engine's last sync: ``engine/probe_diff``, ``engine/sync_seconds``,
        ``engine/syncs`` (empty for the built-in engine, or before the first sync)."""
        return dict(self._vllm.stats) if self._vllm is not None and "engine/probe_diff" in self._vllm.stats else {}

    @contextlib.contextmanager
    def role(self, role: str) -> Iterator[None]:
        """Temporarily activate ``role``."""
        previous = self.active_role
        self.set_role(role)
        try:
            yield
        finally:
            self.set_role(previous)

    def save_role(self, role: str, folder: str | Path) -> Path:
        """Save adapter ``role`` in peft's format to ``folder/role`` (loads with plain
        `PeftModel.from_pretrained(base, folder/role)`)."""
        target = Path(folder) / role
        if role == "default":
            self.model.save_pretrained(target, selected_adapters=[role])
        else:
            self.model.save_pretrained(folder, selected_adapters=[role])
        return target

    def save_pretrained(self, folder: str | Path) -> None:
        """Save the whole model and tokenizer, loadable as ``model: folder``; with LoRA roles the
        active adapter is merged into a copy of the base (the policy keeps its adapters)."""
        model = copy.deepcopy(self.model).merge_and_unload() if self._roles else self.model
        model.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)

    # ----------------------------------------------------------------------------- compute
    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id

    def hidden_states(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor | None = None,
                      needed: Tensor | None = None) -> Tensor:
        """Last-layer hidden states after the final norm. [B, T] -> [B, T, H].

        With ``position_ids`` (packed rows, `collate.collate_packed`) the attention mask is left to
        the model, which keeps attention within each row where positions restart at 0.
        ``needed`` (``[B, T]`` bool, right-padded rows): the positions whose hidden state the
        caller reads. With ``share_prefix``, rows that share their tokens up to their first needed
        position compute that prefix once (`_shared_prefix_plan`); positions before a row's first
        needed one may then hold zeros.
        """
        decoder = self.model.get_decoder()
        if position_ids is not None:
            return decoder(input_ids=input_ids, position_ids=position_ids, use_cache=False).last_hidden_state
        plan = self._shared_prefix_plan(input_ids, attention_mask, needed) if needed is not None else None
        if plan is not None:
            return self._hidden_with_shared_prefixes(decoder, input_ids, attention_mask, *plan)
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        return decoder(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state

    #: shortest prefix worth sharing, in tokens
    min_shared_prefix = MIN_SHARED_PREFIX

    def _shared_prefix_plan(
        self, input_ids: Tensor, attention_mask: Tensor, needed: Tensor
    ) -> PrefixPlan | None:
        """Which rows share which prefix (`collate.shared_prefix_plan`), or None where sharing is
        off or does not pay."""
        if not self.shares_prefixes():
            return None
        lengths = attention_mask.sum(-1).tolist()
        first_needed = torch.where(needed.any(-1), needed.float().argmax(-1), attention_mask.sum(-1)).tolist()
        return shared_prefix_plan(input_ids.tolist(), lengths, first_needed, self.min_shared_prefix)

    def shares_prefixes(self) -> bool:
        """Whether training batches run their rows' shared prefixes once (``share_prefix`` and
        nothing that forbids it); the data modules then keep a task's rows together where that
        costs fewer positions (`collate.batches_by_tokens`)."""
        return self.share_prefix and not (self.gradient_checkpointing or self._stochastic() or self._sharded()
                                          or self._windowed())

    def _windowed(self) -> bool:
        """Whether some layer attends within a sliding window: the window is measured in cache
        columns, and a shared prefix's padding columns would stretch it."""
        config = self.model.config
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
            return True
        return bool(getattr(config, "sliding_window", None)) and getattr(config, "use_sliding_window", True)

    def _sharded(self) -> bool:
        """Whether FSDP wraps the model's layers (a wrapped layer is not called twice in one step)."""
        return any("FullyShardedDataParallel" in type(m).__name__ or type(m).__name__.startswith("FSDP")
                   for m in self.model.modules())

    def _stochastic(self) -> bool:
        """Whether a forward pass draws dropout masks (training mode, some dropout p > 0)."""
        if not self.training:
            return False
        if not hasattr(self, "_has_dropout"):
            self._has_dropout = any(isinstance(m, nn.Dropout) and m.p > 0 for m in self.model.modules())
        return self._has_dropout

    def _hidden_with_shared_prefixes(self, decoder: nn.Module, input_ids: Tensor, attention_mask: Tensor,
                                     prefixes: list[tuple[int, int]], row_prefix: list[int],
                                     row_start: list[int]) -> Tensor:
        """`hidden_states` in two passes: each shared prefix once (right-padded, its keys and
        values cached with their autograd graph), then every row's own tokens against its prefix's
        cache rows (a row without one masks them all), at its true positions."""
        device, pad = input_ids.device, self.pad_id
        cache_name = forward_arguments(decoder)[0]
        width = max(p for _, p in prefixes)
        prefix_ids = input_ids.new_full((len(prefixes), width), pad)
        prefix_mask = torch.zeros_like(prefix_ids)
        for c, (row, length) in enumerate(prefixes):
            prefix_ids[c, :length], prefix_mask[c, :length] = input_ids[row, :length], 1
        positions = torch.arange(width, device=device).expand(len(prefixes), width)
        cache = decoder(input_ids=prefix_ids, attention_mask=prefix_mask, position_ids=positions,
                        use_cache=True)[cache_name]
        cache.batch_select_indices(torch.tensor([max(c, 0) for c in row_prefix], device=device))
        lengths = attention_mask.sum(-1).tolist()
        own = [n - s for n, s in zip(lengths, row_start)]
        B, S = len(own), max(own)
        suffix_ids = input_ids.new_full((B, S), pad)
        mask = torch.zeros(B, width + S, dtype=attention_mask.dtype, device=device)
        rows, cols = [], []
        for r, (start, n) in enumerate(zip(row_start, own)):
            suffix_ids[r, :n] = input_ids[r, start : start + n]
            mask[r, :start] = 1
            mask[r, width : width + n] = 1
            rows += [r] * n
            cols += range(start, start + n)
        positions = (torch.tensor(row_start, device=device)[:, None] + torch.arange(S, device=device)).clamp(
            max=input_ids.shape[1] - 1)
        hidden = decoder(input_ids=suffix_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                         **{cache_name: cache}).last_hidden_state
        rows_t, cols_t = torch.tensor(rows, device=device), torch.tensor(cols, device=device)
        own_t = cols_t - torch.tensor([row_start[r] for r in rows], device=device)
        out = hidden.new_zeros(B, input_ids.shape[1], hidden.shape[-1])
        out[rows_t, cols_t] = hidden[rows_t, own_t]
        return out

    def token_logprobs(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        temperature: float = 1.0,
        position_ids: Tensor | None = None,
        mask: Tensor | None = None,
        entropy: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """log p(token t | tokens < t) for every position, 0 at t = 0. [B, T] -> [B, T] (fp32).

        ``position_ids``: packed rows (see `hidden_states`). ``mask``: compute only where True
        (e.g. the action mask; 0 elsewhere), so the output layer skips prompts and observations.
        ``entropy``: also return the entropy of each predicted distribution (``[B, T]``, detached),
        from the same pass (`losses.token_logprobs_and_entropy`).
        """
        needed = None if mask is None else torch.cat([mask[:, 1:], mask[:, :1] & False], dim=1)  # t-1 predicts t
        hidden = self.hidden_states(input_ids, attention_mask, position_ids, needed)
        head = self.model.get_output_embeddings()
        fn = token_logprobs_and_entropy if entropy else token_logprobs
        out = fn(hidden, head.weight, input_ids, lm_head_bias=head.bias, chunk_size=self.logprob_chunk_size,
                 temperature=temperature, mask=mask)
        return (out[0], out[1].detach()) if entropy else out

    def batch_logprobs(self, batch: dict[str, Any], temperature: float = 1.0,
                       entropy: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """`token_logprobs` of a collated batch (padded or packed), on its action mask only."""
        return self.token_logprobs(
            batch["input_ids"], batch["attention_mask"], temperature,
            position_ids=batch.get("position_ids"), mask=batch["action_mask"], entropy=entropy,
        )

    def num_parameters(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)
