"""AgentPolicy, ChatFormat and the embedded default: tokenizer, roles, adapters, log-probs."""

from __future__ import annotations

import pytest
import torch
from lora_weights import set_lora_b
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from lit_agents.policy import AgentPolicy, ChatFormat, decoder_layers
from lit_agents.tiny import END, SPECIAL_TOKENS, TinyConfig, build_tokenizer, default_corpus, embedded_default


@pytest.fixture(scope="module")
def tiny_folder(tiny_config):
    return embedded_default(tiny_config)


def test_embedded_default_roundtrips_env_text(tiny_folder, textcraft):
    tok = AutoTokenizer.from_pretrained(tiny_folder)
    state, obs = textcraft.reset(textcraft.tasks("test")[0])
    for text in [obs, "craft 4 oak planks using 1 oak logs", "get 2 stick", "ünïcødé ✓ garbage"]:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    # item words from the environment are whole tokens: short sequences for the tiny model
    assert len(tok.encode(" acacia planks", add_special_tokens=False)) == 2
    assert all(tok.convert_tokens_to_ids(t) != tok.unk_token_id for t in SPECIAL_TOKENS)
    assert tok.eos_token == END and tok.pad_token is not None


def test_synth_corpus_makes_item_names_and_repl_code_short():
    from lit_agents.envs import TextCraftSynth

    tok = build_tokenizer(default_corpus("textcraft_synth"), 2048, space_tokens=True)
    env = TextCraftSynth("hard")
    task = env.tasks("test")[0]  # unseen targets: their names are still words of the corpus
    code = env.expert_recursive_program(env.reset(task)[0])
    assert tok.decode(tok.encode(code, add_special_tokens=False)) == code
    names = [n for n in env.world.names if f" {n}" in code or f'"{n}' in code]
    assert names and all(len(tok.encode(n, add_special_tokens=False)) == 1 for n in names)
    assert len(tok.encode(code, add_special_tokens=False)) < len(code) / 3
    # a name is the same token in the task's text and in the code that uses it, so it can be copied
    name = names[0]
    in_text = tok.encode(f"craft 1 {name}", add_special_tokens=False)
    in_code = tok.encode(f'print(get_info("{name}"))', add_special_tokens=False)
    assert in_text[-1] == tok.convert_tokens_to_ids(name) and tok.convert_tokens_to_ids(name) in in_code
    assert TinyConfig(corpus="textcraft_synth").space_tokens and not TinyConfig().space_tokens
    with pytest.raises(ValueError, match="corpus must be"):
        next(default_corpus("alfworld"))


def test_embedded_default_is_deterministic_and_cached(tiny_config, tmp_path):
    a = embedded_default(tiny_config, tmp_path / "a")
    b = embedded_default(tiny_config, tmp_path / "b")
    ma, mb = AutoModelForCausalLM.from_pretrained(a), AutoModelForCausalLM.from_pretrained(b)
    assert all(torch.equal(x, y) for x, y in zip(ma.state_dict().values(), mb.state_dict().values()))
    assert open(f"{a}/tokenizer.json").read() == open(f"{b}/tokenizer.json").read()
    assert embedded_default(tiny_config, tmp_path / "a") == a  # reused, not rebuilt


def test_chat_format_pieces_equal_rendered_conversation(tiny_folder):
    tok = AutoTokenizer.from_pretrained(tiny_folder)
    chat = ChatFormat(tok)
    ids = chat.start("rules", "obs one") + chat.completion("get 1 oak logs") + chat.next("Got 1 oak logs")
    messages = [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "obs one"},
        {"role": "assistant", "content": "get 1 oak logs"},
        {"role": "user", "content": "Got 1 oak logs"},
    ]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ids == tok.encode(rendered, add_special_tokens=False)
    assert chat.stop_ids == (tok.eos_token_id,)
    assert chat.decode_completion(chat.completion(" craft 1 x ")) == "craft 1 x"


def test_roles_adapters_and_reference(tiny_config, tmp_path):
    policy = AgentPolicy(tiny=tiny_config, roles=["planner", "executor"], lora_r=4, attn_implementation="eager")
    assert policy.roles == ["planner", "executor"] and policy.active_role == "planner"
    ids = torch.tensor([[5, 9, 30, 41, 7, 12]])
    mask = torch.ones_like(ids)
    base = policy.token_logprobs(ids, mask)
    # a fresh LoRA adapter (B = 0) equals the base: KL to the reference is 0 at step 0
    torch.testing.assert_close(base, policy.token_logprobs(ids, mask))
    set_lora_b(policy.model, value=0.5, role="executor")
    with policy.role("executor"):
        changed = policy.token_logprobs(ids, mask)
        with policy.adapters_disabled():
            torch.testing.assert_close(policy.token_logprobs(ids, mask), base)
    assert not torch.allclose(changed, base)
    assert policy.active_role == "planner"
    # save with peft's own format; reload with plain peft and reproduce the log-probs
    folder = policy.save_role("executor", tmp_path)
    plain = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(embedded_default(tiny_config)), folder)
    plain.eval()
    policy.eval()
    with policy.role("executor"):
        expected = policy.token_logprobs(ids, mask)
    logits = plain(ids).logits.log_softmax(-1)
    got = logits[0, :-1].gather(-1, ids[0, 1:, None]).squeeze(-1)
    torch.testing.assert_close(got, expected[0, 1:], atol=1e-5, rtol=1e-5)
    # and load_role brings it back into a policy
    other = AgentPolicy(tiny=tiny_config, roles=["planner"], lora_r=4, attn_implementation="eager").eval()
    other.load_role("executor", folder)
    with other.role("executor"):
        torch.testing.assert_close(other.token_logprobs(ids, mask), expected)
    # replacing the active role's weights: forward passes use the loaded ones at once
    other.set_role("executor")
    other.load_role("executor", folder)
    assert other.active_role == "executor"
    torch.testing.assert_close(other.token_logprobs(ids, mask), expected)
    fresh = AgentPolicy(tiny=tiny_config, roles=["executor"], lora_r=4, attn_implementation="eager").eval()
    fresh.load_role("executor", folder)
    torch.testing.assert_close(fresh.token_logprobs(ids, mask), expected)


def test_only_the_active_roles_train(tiny_config):
    policy = AgentPolicy(tiny=tiny_config, roles=["planner", "executor"], lora_r=4)
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    policy.set_role("executor")
    assert trainable == {n for n, p in policy.named_parameters() if p.requires_grad}


def test_clear_errors(tiny_config, tmp_path):
    if not torch.cuda.is_available():  # on a GPU, tests/scripts/qlora_gpu_check.py loads it
        with pytest.raises(ValueError, match="CUDA GPU"):
            AgentPolicy(tiny=tiny_config, load_in_4bit=True)
    with pytest.raises(ValueError, match="full"):
        AgentPolicy(tiny=tiny_config, finetune="full", roles=["a"])
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        AgentPolicy(tiny=tiny_config).load_role("x", tmp_path)
    with pytest.raises(KeyError, match="unknown role"):
        AgentPolicy(tiny=tiny_config).set_role("nope")


def test_full_finetune_saves_a_loadable_model(tiny_config, tmp_path):
    policy = AgentPolicy(tiny=tiny_config, finetune="full")
    assert all(p.requires_grad for p in policy.parameters())
    policy.save_pretrained(tmp_path / "m")
    again = AgentPolicy(model=str(tmp_path / "m"), finetune="full")
    ids = torch.tensor([[3, 4, 5, 6]])
    torch.testing.assert_close(
        policy.eval().token_logprobs(ids, torch.ones_like(ids)), again.eval().token_logprobs(ids, torch.ones_like(ids))
    )


def test_save_pretrained_merges_a_copy_and_keeps_the_adapters(tiny_config, tmp_path):
    policy = AgentPolicy(tiny=tiny_config, lora_r=4).eval()
    set_lora_b(policy.model, value=0.3)
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    expected = policy.token_logprobs(ids, torch.ones_like(ids))
    with policy.adapters_disabled():
        base = policy.token_logprobs(ids, torch.ones_like(ids))
    assert not torch.allclose(expected, base, atol=1e-3)  # the adapter matters: a merge that drops it fails below
    policy.save_pretrained(tmp_path / "merged")
    assert policy.roles == ["default"]  # still a LoRA policy
    torch.testing.assert_close(policy.token_logprobs(ids, torch.ones_like(ids)), expected)
    merged = AgentPolicy(model=str(tmp_path / "merged"), finetune="full").eval()
    torch.testing.assert_close(merged.token_logprobs(ids, torch.ones_like(ids)), expected, atol=1e-5, rtol=1e-5)


def test_merge_adapter_starts_from_the_lora_trained_model(tiny_config, tmp_path):
    """RL after LoRA SFT: the SFT adapter folded into the base; a fresh role on top starts at that
    model, and the KL reference `base` (adapters disabled) is the merged model, not the raw base."""
    AgentPolicy(tiny=tiny_config, finetune="full").save_pretrained(tmp_path / "base")
    sft = AgentPolicy(model=str(tmp_path / "base"), lora_r=4).eval()
    set_lora_b(sft.model, value=0.3)
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    mask = torch.ones_like(ids)
    trained = sft.token_logprobs(ids, mask)
    with sft.adapters_disabled():
        raw = sft.token_logprobs(ids, mask)
    assert not torch.allclose(trained, raw, atol=1e-3)  # the adapter matters
    saved = sft.save_role("default", tmp_path / "adapters")
    rl = AgentPolicy(model=str(tmp_path / "base"), merge_adapter=str(saved), lora_r=4).eval()
    assert rl.roles == ["default"]
    torch.testing.assert_close(rl.token_logprobs(ids, mask), trained, atol=1e-5, rtol=1e-5)
    with rl.adapters_disabled():
        torch.testing.assert_close(rl.token_logprobs(ids, mask), trained, atol=1e-5, rtol=1e-5)
    with pytest.raises(FileNotFoundError, match="role folders \\['default'\\]"):
        AgentPolicy(model=str(tmp_path / "base"), merge_adapter=str(tmp_path / "adapters"))


def _arch_folder(arch: str, tiny_folder, tmp_path) -> str:
    """A random 2-layer model of ``arch`` (qwen2, llama, gpt2; no dropout) with the embedded
    default's tokenizer, saved under ``tmp_path/m``: the architectures users bring."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_folder)
    tokenizer.save_pretrained(tmp_path / "m")
    common = dict(vocab_size=len(tokenizer), attn_implementation="sdpa")
    if arch == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=256, resid_pdrop=0.0,
                                           embd_pdrop=0.0, attn_pdrop=0.0, **common))
    else:
        config_cls, model_cls = (Qwen2Config, Qwen2ForCausalLM) if arch == "qwen2" else (LlamaConfig, LlamaForCausalLM)
        model = model_cls(config_cls(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, max_position_embeddings=256, **common))
    model.save_pretrained(tmp_path / "m")
    return str(tmp_path / "m")


@pytest.mark.parametrize("arch", ["qwen2", "llama", "gpt2"])
def test_packed_rows_give_the_same_logprobs_as_padded(arch, tiny_folder, tmp_path):
    """Rows end to end with restarting positions: attention stays within each row (any of the
    architectures users bring), and the output layer runs on the action mask only."""
    from lit_agents.algorithms.collate import collate_packed, collate_rows, demo_row

    policy = AgentPolicy(_arch_folder(arch, tiny_folder, tmp_path), finetune="full").eval()
    gen = torch.Generator().manual_seed(1)
    rows = [
        demo_row(torch.randint(1, 64, (n,), generator=gen).tolist(), torch.randint(1, 64, (k,), generator=gen).tolist())
        for n, k in ((5, 3), (2, 6), (9, 1), (3, 3))
    ]
    padded = collate_rows(rows, pad_id=0)
    packed = collate_packed([[rows[0], rows[1]], [rows[2], rows[3]]], pad_id=0)
    with torch.no_grad():
        want = policy.token_logprobs(padded["input_ids"], padded["attention_mask"])
        got = policy.batch_logprobs(packed)
    order = [(0, 0), (0, 8), (1, 0), (1, 10)]  # (pack, offset) of each row
    for row, (p, offset) in zip(rows, order):
        n, mask = row.num_tokens, torch.tensor(row.action_mask)
        i = rows.index(row)
        torch.testing.assert_close(got[p, offset : offset + n][mask], want[i, :n][mask], atol=1e-5, rtol=1e-5)
    assert (got[~packed["action_mask"]] == 0).all()


def _assert_same_logprobs_and_gradients(tiny_config, **option) -> AgentPolicy:
    """A LoRA policy built with ``option`` gives the plain policy's log-probs, gradients and
    state-dict keys; returns it."""
    ids = torch.tensor([[3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 0, 0]])
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    results = []
    for kwargs in ({}, option):
        torch.manual_seed(0)
        policy = AgentPolicy(tiny=tiny_config, lora_r=4, lora_dropout=0.0, **kwargs)
        logp = policy.token_logprobs(ids, mask)
        (logp * mask).sum().backward()
        grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
        results.append((logp.detach(), grads, set(policy.state_dict())))
    (plain, plain_grads, plain_keys), (other, other_grads, other_keys) = results
    torch.testing.assert_close(other, plain, atol=1e-5, rtol=1e-4)
    assert other_keys == plain_keys and other_grads.keys() == plain_grads.keys() and plain_grads
    for name, grad in plain_grads.items():
        torch.testing.assert_close(other_grads[name], grad, atol=1e-5, rtol=1e-4)
    return policy


def test_compiled_layers_give_the_same_logprobs_and_gradients(tiny_config):
    """``compile=True`` compiles each decoder layer in place: same numbers, same state-dict keys."""
    _assert_same_logprobs_and_gradients(tiny_config, compile=True)


def test_rollouts_run_compiled_layers_uncompiled(tiny_config):
    """The engine calls layers compiled in place uncompiled (with a cache they would recompile per
    layer index) and leaves them compiled for training afterwards."""
    import torch._dynamo

    from lit_agents.generation import GenerationEngine, SamplingParams

    policy = AgentPolicy(tiny=tiny_config, finetune="full", compile=True).eval()
    layers = list(decoder_layers(policy.model))
    frames = torch._dynamo.utils.counters["stats"]["calls_captured"]
    engine = GenerationEngine(policy.model, pad_token_id=policy.pad_id)
    engine.generate([None, None], [[3, 4, 5], [6, 7]], SamplingParams(max_new_tokens=4))
    assert torch._dynamo.utils.counters["stats"]["calls_captured"] == frames  # nothing was traced
    assert all(layer._compiled_call_impl is not None for layer in layers)


def test_merged_adapter_generates_as_the_live_adapter_and_restores_the_weights(tiny_config):
    """Rollouts fold a single LoRA adapter into the weights: the same greedy tokens and log-probs
    as the live adapter, the original weight tensors back afterwards, and no merge where it would
    not be the training policy (two roles, bf16 autocast, training mode)."""
    from lit_agents.generation import GenerationEngine, SamplingParams

    torch.manual_seed(0)
    policy = AgentPolicy(tiny=tiny_config, lora_r=4, lora_targets="all-linear").eval()
    set_lora_b(policy.model, std=0.2)  # an adapter that changes what the model writes
    before = {n: (p.data_ptr(), p.detach().clone()) for n, p in policy.model.named_parameters()}
    prompts, params = [[3, 4, 5, 6], [7, 8, 9]], SamplingParams(max_new_tokens=12, temperature=0.0)

    def generate():
        with torch.no_grad():
            out = GenerationEngine(policy.model, pad_token_id=policy.pad_id).generate([None, None], prompts, params)
        return [r.token_ids for r in out], torch.tensor([lp for r in out for lp in r.logprobs])

    live_ids, live_lp = generate()
    with torch.no_grad():
        base = GenerationEngine(policy.model, pad_token_id=policy.pad_id)
        with policy.adapters_disabled():
            base_ids = [r.token_ids for r in base.generate([None, None], prompts, params)]
    assert base_ids != live_ids  # the adapter matters, so equality below means it was folded in
    with policy.merged_adapter() as merged:
        assert merged
        assert all(before[n][1].ne(p).any() for n, p in policy.model.named_parameters() if "base_layer.weight" in n)
        merged_ids, merged_lp = generate()
    assert merged_ids == live_ids
    torch.testing.assert_close(merged_lp, live_lp, atol=1e-5, rtol=1e-5)
    for name, p in policy.model.named_parameters():  # the very same tensors, bit for bit
        assert p.data_ptr() == before[name][0] and torch.equal(p, before[name][1]), name

    with torch.autocast("cpu", dtype=torch.bfloat16), policy.merged_adapter() as merged:
        assert not merged
    policy.train()
    with policy.merged_adapter() as merged:
        assert not merged
    two = AgentPolicy(tiny=tiny_config, roles=["planner", "executor"], lora_r=4).eval()
    with two.merged_adapter() as merged:
        assert not merged


@pytest.mark.parametrize("arch", ["qwen2", "llama", "gpt2"])
def test_shared_prefixes_give_the_same_logprobs_and_gradients(arch, tiny_folder, tmp_path):
    """Rows that start alike (G samples of one task) run their common prefix once: the same
    log-probs on the trained tokens and the same gradients as every row in full, with the prefix
    pass actually taken, a row of another task and rows of other lengths in the batch."""
    from lit_agents.algorithms.collate import collate_rows, segments_row

    folder = _arch_folder(arch, tiny_folder, tmp_path)
    policy = AgentPolicy(folder, lora_r=4, lora_dropout=0.0, lora_targets="all-linear").train()
    set_lora_b(policy.model, std=0.1)
    gen = torch.Generator().manual_seed(1)

    def ids(n: int) -> list[int]:
        return torch.randint(4, 64, (n,), generator=gen).tolist()

    task_a, task_b = ids(40), ids(24)
    rows = [segments_row([(task_a, False), (ids(k), True), (ids(7), False), (ids(m), True)])
            for k, m in ((5, 9), (3, 2), (8, 12))]
    rows += [segments_row([(task_b, False), (ids(k), True)]) for k in (6, 11)]
    rows += [segments_row([(ids(30), False), (ids(4), True)])]  # a task of its own: nothing to share
    batch = collate_rows(rows, pad_id=policy.pad_id)
    plan = policy._shared_prefix_plan(batch["input_ids"], batch["attention_mask"],
                                      torch.cat([batch["action_mask"][:, 1:], batch["action_mask"][:, :1] & False], 1))
    # up to the hidden state that predicts each group's first trained token
    assert plan is not None and [length for _, length in plan[0]] == [39, 23] and plan[1][-1] == -1
    params = [p for p in policy.parameters() if p.requires_grad]
    adv = torch.randn(batch["action_mask"].shape, generator=gen)
    results = {}
    for share in (True, False):
        policy.share_prefix = share
        logp = policy.batch_logprobs(batch)
        loss = (logp * adv)[batch["action_mask"]].sum()
        results[share] = (logp[batch["action_mask"]].detach(), torch.autograd.grad(loss, params))
    torch.testing.assert_close(results[True][0], results[False][0], atol=1e-5, rtol=1e-5)
    for g_shared, g_full in zip(results[True][1], results[False][1]):
        torch.testing.assert_close(g_shared, g_full, atol=1e-5, rtol=1e-4)
    policy.share_prefix = True
    if arch == "qwen2":  # a sliding window counts cache columns: a prefix's padding would stretch it
        config = policy.model.config
        config.use_sliding_window, config.sliding_window = True, 32
        assert policy._shared_prefix_plan(batch["input_ids"], batch["attention_mask"], batch["action_mask"]) is None
        config.use_sliding_window, config.sliding_window = False, None
        assert policy._shared_prefix_plan(batch["input_ids"], batch["attention_mask"], batch["action_mask"])
    with_dropout = AgentPolicy(folder, lora_r=4, lora_dropout=0.1).train()
    assert with_dropout._shared_prefix_plan(batch["input_ids"], batch["attention_mask"], batch["action_mask"]) is None


def test_gradient_checkpointing_gives_the_same_gradients_without_the_deprecated_call(tiny_config, recwarn):
    """``gradient_checkpointing=True`` recomputes activations (the model says it checkpoints) and
    changes no number; it calls transformers' current name, not the one removed in v6."""
    policy = _assert_same_logprobs_and_gradients(tiny_config, gradient_checkpointing=True)
    base = policy.model.get_base_model() if isinstance(policy.model, PeftModel) else policy.model
    flag = next(f for f in ("is_activation_checkpointing", "is_gradient_checkpointing") if hasattr(base, f))
    assert getattr(base, flag)
    assert not any("gradient_checkpointing_enable" in str(w.message) for w in recwarn)
