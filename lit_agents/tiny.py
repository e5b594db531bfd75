"""The embedded default model: a tokenizer built from environment text and a small random model.

With no model named, every config runs on a laptop CPU with no download: a byte-level BPE
tokenizer is trained (with `tokenizers`) on the text the environments show and accept, saved as
a `PreTrainedTokenizerFast` with special tokens for turns and roles and a chat template, and a
small randomly initialised Qwen2 or Llama model is built from a transformers config. Both are
written to a folder and loaded back through the same `from_pretrained` path as any checkpoint,
so the rest of the library never special-cases them. Building is deterministic (fixed corpus
order and init seed), and the folder is cached by a hash of the settings.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from lit_agents.envs.repl import LAUNCH_DOC
from lit_agents.envs.textcraft import TextCraft
from lit_agents.envs.textcraft_synth import TextCraftSynth
from lit_agents.models import cache_root, save_pretrained_atomically

PAD, END, SYSTEM, USER, ASSISTANT = "<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"
SPECIAL_TOKENS = [PAD, END, SYSTEM, USER, ASSISTANT]

#: A minimal chat template: `<|role|>content<|end|>` per message. `<|end|>` is also the EOS, so
#: the policy learns to stop by sampling it, and the agent loop stops generation on it.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@dataclass
class TinyConfig:
    """Size of the embedded default model.

    Attributes:
        arch: transformers architecture to instantiate.
        vocab_size: BPE vocabulary size (special tokens included).
        hidden_size: model width.
        num_layers: decoder layers.
        num_heads: attention heads.
        num_kv_heads: key/value heads (grouped-query attention).
        intermediate_size: MLP width.
        max_position_embeddings: longest context.
        seed: initialisation seed.
        corpus: the text the tokenizer is built from: ``textcraft`` (TextCraft's recipes and
            observations) or ``textcraft_synth`` (TextCraft-Synth's invented item names and the
            Python its REPL agents write, for RAO).
        space_tokens: spaces are tokens of their own (a run of spaces is one piece), so a word
            is the same token after a space, a quote or a bracket: a name read in the task text
            (``craft 1 pupa``) is the token the code writes (``get_info("pupa")``), which a
            small model can copy. Costs a token between words. ``None``: on for
            ``textcraft_synth`` (the REPL agents copy names into code), off for ``textcraft``.
    """

    arch: Literal["qwen2", "llama"] = "qwen2"
    vocab_size: int = 2048
    hidden_size: int = 192
    num_layers: int = 4
    num_heads: int = 6
    num_kv_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 4096
    seed: int = 0
    corpus: Literal["textcraft", "textcraft_synth"] = "textcraft"
    space_tokens: bool | None = None

    def __post_init__(self) -> None:
        if self.space_tokens is None:
            self.space_tokens = self.corpus == "textcraft_synth"


def default_corpus(name: str = "textcraft") -> Iterator[str]:
    """Text of an environment shipped with the library (its `corpus()`), in a fixed order; for
    ``textcraft_synth`` also the expert's REPL programs (linear and recursive) of train tasks
    of every difficulty, so that code and the subagent tool are words of the vocabulary."""
    if name == "textcraft":
        yield from TextCraft(min_depth=1, max_depth=10).corpus()
    elif name == "textcraft_synth":
        yield LAUNCH_DOC + "\n```python\n```"
        for difficulty in ("easy", "medium", "hard"):
            env = TextCraftSynth(difficulty)
            yield from env.corpus()
            for task in env.tasks("train")[:50]:
                yield env.expert_program(task)
                yield env.expert_recursive_program(env.reset(task)[0])
    else:
        raise ValueError(f"corpus must be 'textcraft' or 'textcraft_synth', got {name!r}")


def build_tokenizer(
    corpus: Iterable[str], vocab_size: int = 2048, space_tokens: bool = False
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``corpus`` (exact round-trip on any text);
    ``space_tokens``: see `TinyConfig`."""
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if space_tokens:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(" +"), "isolated"), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=END,
        additional_special_tokens=[SYSTEM, USER, ASSISTANT],
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def build_model(tokenizer: PreTrainedTokenizerFast, cfg: TinyConfig) -> PreTrainedModel:
    """A randomly initialised causal LM of the given size, seeded for reproducibility."""
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    config_cls, model_cls = {
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "llama": (LlamaConfig, LlamaForCausalLM),
    }[cfg.arch]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        return model_cls(config_cls(**common))


def embedded_default(cfg: TinyConfig | None = None, path: str | os.PathLike | None = None) -> str:
    """Build (once) and return the folder of the embedded default model + tokenizer.

    Args:
        cfg: model size; defaults to `TinyConfig()`.
        path: where to write it; defaults to a cache folder keyed by a hash of ``cfg``.
    """
    cfg = cfg or TinyConfig()
    key = hashlib.sha256(json.dumps(asdict(cfg), sort_keys=True).encode()).hexdigest()[:12]
    folder = Path(path) if path is not None else cache_root() / f"tiny-{key}"
    if (folder / "config.json").exists() and (folder / "tokenizer.json").exists():
        return str(folder)
    tokenizer = build_tokenizer(default_corpus(cfg.corpus), cfg.vocab_size, cfg.space_tokens)
    model = build_model(tokenizer, cfg)
    save_pretrained_atomically(model, tokenizer, folder)
    return str(folder)
