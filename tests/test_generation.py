"""The rollout engine against full forward passes, on tiny random models (CPU, no download)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from transformers import (
    AttentionInterface,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from lit_agents.generation import (
    DECODE_ATTENTION,
    GenerationEngine,
    KVContext,
    SamplingParams,
    decode_attention,
    sample_from_logits,
)
from lit_agents.generation.sampling import _inverse_cdf

VOCAB = 97
PAD = 0


@pytest.fixture(autouse=True, scope="module")
def single_thread():
    """Tiny models run fastest on one thread (and do not stall when the CPUs are shared)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_model(arch: str = "qwen2", attn: str = "sdpa") -> torch.nn.Module:
    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, attn_implementation=attn)
    if arch == "qwen2":
        config = Qwen2Config(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, **common,
        )
        model = Qwen2ForCausalLM(config)
    elif arch == "llama":
        config = LlamaConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, **common,
        )
        model = LlamaForCausalLM(config)
    else:
        config = GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=512, **common)
        model = GPT2LMHeadModel(config)
    return model.float().eval()


def reference_logprobs(model: torch.nn.Module, history: list[int], completion: list[int]) -> torch.Tensor:
    """Temperature-1 log-probs of ``completion`` after ``history`` from one uncached forward pass."""
    ids = torch.tensor([history + completion])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    return logp[len(history) - 1 : -1].gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def assert_close(got: Any, want: Any, atol: float = 1e-4) -> None:
    torch.testing.assert_close(torch.as_tensor(got), torch.as_tensor(want), atol=atol, rtol=0)


def random_ids(n: int, gen: torch.Generator) -> list[int]:
    return torch.randint(1, VOCAB, (n,), generator=gen).tolist()


class CharTokenizer:
    """Each token decodes to a fixed short string (some tokens to two characters)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(97 + i % 26) * (1 + i % 2) for i in ids)


@pytest.mark.parametrize("decode", ["dynamic", "static"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", ["qwen2", "llama", "gpt2"])
def test_logprobs_match_full_forward_with_different_prompt_lengths(arch: str, attn: str, decode: str) -> None:
    model = make_model(arch, attn)
    engine = GenerationEngine(model, pad_token_id=PAD, decode=decode)
    gen = torch.Generator().manual_seed(1)
    prompts = [random_ids(n, gen) for n in (3, 11, 1, 7)]
    out = engine.generate([None] * 4, prompts, SamplingParams(max_new_tokens=12), gen)
    for prompt, completion in zip(prompts, out):
        assert len(completion.token_ids) == 12 and completion.finish_reason == "length"
        ref = reference_logprobs(model, prompt, completion.token_ids)
        assert_close(completion.logprobs, ref)
        assert completion.context.num_tokens == len(prompt) + 12


def naive_generate(
    model: torch.nn.Module, histories: list[list[int]], params: SamplingParams, gen: torch.Generator
) -> list[tuple[list[int], list[float]]]:
    """Re-encode every history at every step with no cache, drawing randomness like the engine."""
    outs: list[tuple[list[int], list[float]]] = [([], []) for _ in histories]
    live = [True] * len(histories)
    for _ in range(params.max_new_tokens):
        uniform = torch.rand(len(histories), generator=gen)
        for i, history in enumerate(histories):
            if not live[i]:
                continue
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([history + outs[i][0]])).logits[:, -1]
            tok, lp = sample_from_logits(logits, params.temperature, params.top_p, uniform[i : i + 1])
            outs[i][0].append(int(tok))
            outs[i][1].append(float(lp))
            live[i] = int(tok) not in params.stop_token_ids
        if not any(live):
            break
    return outs


@pytest.mark.parametrize("decode", ["dynamic", "static"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_multi_turn_kv_reuse_matches_reencoding(attn: str, decode: str) -> None:
    model = make_model("qwen2", attn)
    engine = GenerationEngine(model, pad_token_id=PAD, decode=decode)
    params = SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=6, stop_token_ids=(5, 17, 33))
    gen_ids = torch.Generator().manual_seed(2)
    engine_gen, naive_gen = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    histories: list[list[int]] = [[] for _ in range(4)]
    contexts: list[KVContext | None] = [None] * 4
    for turn in range(3):
        # session 3 of the batch starts a turn late: new and continuing sessions share a batch
        new = [random_ids(2 + 3 * i + turn, gen_ids) if (i < 3 or turn > 0) else [] for i in range(4)]
        rows = [i for i in range(4) if new[i]]
        out = engine.generate([contexts[i] for i in rows], [new[i] for i in rows], params, engine_gen)
        ref = naive_generate(model, [histories[i] + new[i] for i in rows], params, naive_gen)
        for i, completion, (ref_ids, ref_lps) in zip(rows, out, ref):
            assert completion.token_ids == ref_ids
            assert_close(completion.logprobs, ref_lps)
            histories[i] += new[i]
            # the same ids score the same in one uncached pass (temperature + top-p applied by hand)
            scaled = truncated_logprobs(model, histories[i], completion.token_ids, params)
            assert_close(completion.logprobs, scaled)
            histories[i] += completion.token_ids
            contexts[i] = completion.context
            assert completion.context.num_tokens == len(histories[i])


def truncated_logprobs(
    model: torch.nn.Module, history: list[int], completion: list[int], params: SamplingParams
) -> torch.Tensor:
    """Log-probs of ``completion`` under temperature + top-p, from one uncached forward pass."""
    ids = torch.tensor([history + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(history) - 1 : -1].float()
    logp = torch.log_softmax(logits / params.temperature, -1)
    sorted_logp, order = logp.sort(-1, descending=True)
    probs = sorted_logp.exp()
    keep_sorted = (probs.cumsum(-1) - probs) < params.top_p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    renorm = torch.log_softmax(logp.masked_fill(~keep, float("-inf")), -1)
    return renorm.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


@pytest.mark.parametrize("decode", ["dynamic", "static"])
def test_multi_turn_temperature_one_matches_full_forward(decode: str) -> None:
    model = make_model("llama", "sdpa")
    engine = GenerationEngine(model, pad_token_id=PAD, decode=decode)
    gen = torch.Generator().manual_seed(4)
    histories: list[list[int]] = [[] for _ in range(4)]
    contexts: list[KVContext | None] = [None] * 4
    for turn in range(3):
        new = [random_ids(1 + (5 * i + 3 * turn) % 9, gen) for i in range(4)]
        out = engine.generate(contexts, new, SamplingParams(max_new_tokens=5, stop_token_ids=(7,)), gen)
        for i, completion in enumerate(out):
            histories[i] += new[i]
            ref = reference_logprobs(model, histories[i], completion.token_ids)
            assert_close(completion.logprobs, ref)
            histories[i] += completion.token_ids
            contexts[i] = completion.context


def greedy(engine: GenerationEngine, prompts: list[list[int]], **kw) -> list:
    return engine.generate([None] * len(prompts), prompts, SamplingParams(temperature=0.0, **kw))


def test_stop_tokens_cut_and_rows_are_independent() -> None:
    model = make_model()
    gen = torch.Generator().manual_seed(5)
    prompts = [random_ids(n, gen) for n in (4, 9, 2, 6, 5)]
    engine = GenerationEngine(model, pad_token_id=PAD)
    free = greedy(engine, prompts, max_new_tokens=16)
    assert all(len(c.token_ids) == 16 and c.finish_reason == "length" for c in free)
    stop_ids = (free[0].token_ids[2], free[1].token_ids[6])
    for fraction in (0.0, 0.25, 1.0):
        engine = GenerationEngine(model, pad_token_id=PAD, compact_fraction=fraction)
        batched = greedy(engine, prompts, max_new_tokens=16, stop_token_ids=stop_ids)
        for prompt, full, got in zip(prompts, free, batched):
            cut = next((k + 1 for k, t in enumerate(full.token_ids) if t in stop_ids), None)
            assert got.token_ids == full.token_ids[: cut or 16]
            assert got.finish_reason == ("stop" if cut else "length")
            alone = greedy(engine, [prompt], max_new_tokens=16, stop_token_ids=stop_ids)[0]
            assert alone.token_ids == got.token_ids and alone.finish_reason == got.finish_reason
            assert_close(alone.logprobs, got.logprobs, atol=1e-5)
            ref = reference_logprobs(model, prompt, got.token_ids)
            assert_close(got.logprobs, ref)
            assert got.context.num_tokens == len(prompt) + len(got.token_ids)
    assert {c.finish_reason for c in batched} == {"stop", "length"}


def test_stop_strings_cut_after_completing_token() -> None:
    model = make_model()
    tok = CharTokenizer()
    engine = GenerationEngine(model, pad_token_id=PAD, tokenizer=tok)
    gen = torch.Generator().manual_seed(6)
    prompts = [random_ids(n, gen) for n in (3, 8, 5)]
    free = greedy(engine, prompts, max_new_tokens=12)
    text0 = tok.decode(free[0].token_ids)
    stop = text0[3:6]  # spans token boundaries
    got = greedy(engine, prompts, max_new_tokens=12, stop_strings=(stop,))
    for full, completion in zip(free, got):
        cut = next((k + 1 for k in range(12) if stop in tok.decode(full.token_ids[: k + 1])), None)
        assert completion.token_ids == full.token_ids[: cut or 12]
        assert completion.finish_reason == ("stop" if cut else "length")
    assert got[0].finish_reason == "stop" and tok.decode(got[0].token_ids).find(stop) >= 0
    with pytest.raises(ValueError, match="tokenizer"):
        no_tokenizer = GenerationEngine(model, pad_token_id=PAD)
        no_tokenizer.generate([None], [[1, 2]], SamplingParams(stop_strings=("a",)))


def test_max_new_tokens_and_input_errors() -> None:
    engine = GenerationEngine(make_model(), pad_token_id=PAD)
    out = engine.generate([None, None], [[1, 2, 3], [4]], SamplingParams(max_new_tokens=1))
    assert [len(c.token_ids) for c in out] == [1, 1] and {c.finish_reason for c in out} == {"length"}
    assert out[0].context.num_cached == 3 and out[0].context.pending_ids == (out[0].token_ids[0],)
    with pytest.raises(ValueError, match="at least one"):
        engine.generate([None], [[]], SamplingParams())
    with pytest.raises(ValueError):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError):
        SamplingParams(max_new_tokens=0)


def test_sample_from_logits_hand_computed() -> None:
    # probabilities [0.15, 0.5, 0.05, 0.3]; top_p 0.75 keeps {0.5, 0.3} -> renormalized 0.625 / 0.375
    logits = torch.tensor([[0.15, 0.5, 0.05, 0.3]]).log().repeat(3, 1) + 1.7
    tokens, logprobs = sample_from_logits(logits, 1.0, 0.75, torch.tensor([0.1, 0.6, 0.9]))
    assert tokens.tolist() == [1, 1, 3]
    torch.testing.assert_close(logprobs, torch.tensor([math.log(0.625)] * 2 + [math.log(0.375)]))
    # no truncation: the inverse CDF walks the vocabulary in order: cdf 0.15, 0.65, 0.70, 1.0
    tokens, logprobs = sample_from_logits(logits, 1.0, 1.0, torch.tensor([0.1, 0.68, 0.99]))
    assert tokens.tolist() == [0, 2, 3]
    torch.testing.assert_close(logprobs, torch.tensor([0.15, 0.05, 0.3]).log())
    # temperature 2 on logits [2, 0]: probs softmax([1, 0]) = [e/(e+1), 1/(e+1)]
    t_logits = torch.tensor([[2.0, 0.0]])
    _, lp = sample_from_logits(t_logits, 2.0, 1.0, torch.tensor([0.99]))
    assert lp.item() == pytest.approx(math.log(1 / (math.e + 1)), abs=1e-6)
    # greedy reports the temperature-1 log-prob
    tokens, lp = sample_from_logits(logits[:1], 0.0, 0.5, None)
    assert tokens.item() == 1 and lp.item() == pytest.approx(math.log(0.5), abs=1e-6)
    # empirical frequencies under top-p follow the renormalized distribution
    uniform = torch.rand(20000, generator=torch.Generator().manual_seed(0))
    tokens, _ = sample_from_logits(logits[:1].repeat(20000, 1), 1.0, 0.75, uniform)
    freq = torch.bincount(tokens, minlength=4).float() / 20000
    torch.testing.assert_close(freq, torch.tensor([0.0, 0.625, 0.0, 0.375]), atol=0.015, rtol=0)


def test_same_seed_same_outputs() -> None:
    engine = GenerationEngine(make_model(), pad_token_id=PAD)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    params = SamplingParams(temperature=1.3, top_p=0.95, max_new_tokens=10)
    runs = [engine.generate([None] * 3, prompts, params, torch.Generator().manual_seed(s)) for s in (7, 7, 8)]
    assert [c.token_ids for c in runs[0]] == [c.token_ids for c in runs[1]]
    assert [c.logprobs for c in runs[0]] == [c.logprobs for c in runs[1]]
    assert [c.token_ids for c in runs[0]] != [c.token_ids for c in runs[2]]


def test_fork_continues_independently() -> None:
    model = make_model()
    engine = GenerationEngine(model, pad_token_id=PAD)
    params = SamplingParams(max_new_tokens=6)
    first = engine.generate([None], [[1, 2, 3, 4]], params, torch.Generator().manual_seed(9))[0]
    original = first.context
    snapshot = [k.clone() for k in original.keys]
    forked = engine.fork(original)
    engine.generate([forked, forked], [[10, 11], [12]], params, torch.Generator().manual_seed(10))
    after = engine.generate([original], [[20, 21, 22]], params, torch.Generator().manual_seed(11))[0]
    assert all(torch.equal(a, b) for a, b in zip(original.keys, snapshot))
    # same as continuing a session that was never forked
    again = engine.generate([None], [[1, 2, 3, 4]], params, torch.Generator().manual_seed(9))[0]
    fresh = engine.generate([again.context], [[20, 21, 22]], params, torch.Generator().manual_seed(11))[0]
    assert after.token_ids == fresh.token_ids
    history = [1, 2, 3, 4] + first.token_ids + [20, 21, 22]
    assert_close(after.logprobs, reference_logprobs(model, history, after.token_ids))


@pytest.mark.parametrize("decode", ["dynamic", "static"])
def test_peft_model(decode: str) -> None:
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = get_peft_model(make_model(), lora)
    model.eval()
    engine = GenerationEngine(model, pad_token_id=PAD, decode=decode)
    histories = [[1, 2, 3], [4, 5, 6, 7, 8, 9]]
    gen = torch.Generator().manual_seed(0)
    out = engine.generate([None, None], histories, SamplingParams(max_new_tokens=5), gen)
    histories = [h + c.token_ids + obs for h, c, obs in zip(histories, out, [[3], [4, 4]])]
    out = engine.generate([c.context for c in out], [[3], [4, 4]], SamplingParams(max_new_tokens=5), gen)
    for history, completion in zip(histories, out):
        ref = reference_logprobs(model, history, completion.token_ids)
        assert_close(completion.logprobs, ref)


def test_output_layer_reads_contiguous_hidden_states() -> None:
    """The prefill's last position reaches the output layer as a contiguous [b, 1, H] tensor (a
    strided slice of [b, n, H] made the CPU head a batched matmul over per-row weight copies)."""
    model = make_model()
    seen = []
    handle = model.get_output_embeddings().register_forward_pre_hook(
        lambda module, args: seen.append((tuple(args[0].shape), args[0].is_contiguous())))
    try:
        greedy(GenerationEngine(model, pad_token_id=PAD), [[3, 4, 5, 6, 7], [8, 9, 10]], max_new_tokens=3)
    finally:
        handle.remove()
    assert seen and seen[0][0] == (2, 1, model.config.hidden_size)
    assert all(contiguous for _, contiguous in seen)


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_shared_prefill_matches_separate_prefill(arch: str) -> None:
    """A group's identical prompts (and forks reading the same tokens) are prefilled once; the
    samples, their log-probs and the continued sessions match prefilling every session."""
    model = make_model(arch)
    params = SamplingParams(temperature=1.0, max_new_tokens=8, stop_token_ids=(5, 17))
    gen_ids = torch.Generator().manual_seed(4)
    task_a, task_b = random_ids(9, gen_ids), random_ids(5, gen_ids)
    prompts = [task_a, task_a, task_b, task_a, task_b]
    runs = []
    for share in (True, False):
        engine = GenerationEngine(model, pad_token_id=PAD, share_prefill=share)
        calls = []
        original = engine._prefill
        engine._prefill = lambda ctx, chunks, n: calls.append(len(chunks)) or original(ctx, chunks, n)
        gen = torch.Generator().manual_seed(5)
        first = engine.generate([None] * 5, prompts, params, gen)
        parent = first[0].context
        second = engine.generate(
            [parent, engine.fork(parent), first[1].context], [[3, 4], [3, 4], [3, 4]], params, gen
        )
        runs.append((calls, first, second))
    (shared_calls, *shared), (plain_calls, *plain) = runs
    assert shared_calls == [2, 2] and plain_calls == [5, 3]
    for got, want in zip(shared, plain):
        assert [c.token_ids for c in got] == [c.token_ids for c in want]
        for g, w in zip(got, want):
            assert_close(g.logprobs, w.logprobs)
            assert g.context.num_tokens == w.context.num_tokens
    for prompt, completion in zip(prompts, shared[0]):
        assert_close(completion.logprobs, reference_logprobs(model, prompt, completion.token_ids))
    history = task_a + shared[0][0].token_ids + [3, 4]
    for completion in shared[1][:2]:
        assert_close(completion.logprobs, reference_logprobs(model, history, completion.token_ids))


def static_vs_dynamic(model: torch.nn.Module, device: str, **engine_kw: Any) -> None:
    """Static decode (with ``engine_kw``) samples what dynamic decode samples, over turns with
    stop tokens (rows finish at different steps, the batch is compacted) and greedy turns."""
    model = model.to(device)
    gen_ids = torch.Generator().manual_seed(8)
    prompts = [random_ids(n, gen_ids) for n in (4, 9, 2, 6, 13, 5)]
    runs = []
    for kw in ({"decode": "dynamic"}, engine_kw):
        engine = GenerationEngine(model, pad_token_id=PAD, **kw)
        gen = torch.Generator(device=device).manual_seed(9)
        out = engine.generate([None] * 6, prompts, SamplingParams(max_new_tokens=24, stop_token_ids=(5, 17, 33)), gen)
        more = engine.generate(
            [c.context for c in out], [[3, 4]] * 6, SamplingParams(temperature=0.0, max_new_tokens=9)
        )
        runs.append(out + more)
    for got, want in zip(*runs):
        assert got.token_ids == want.token_ids and got.finish_reason == want.finish_reason
        assert_close(got.logprobs, want.logprobs, atol=2e-4)
        assert got.context.num_tokens == want.context.num_tokens
        for k_got, k_want in zip(got.context.keys, want.context.keys):
            assert_close(k_got, k_want, atol=1e-4)


@pytest.mark.parametrize("check_every", [1, 4])
def test_static_decode_matches_dynamic(check_every: int) -> None:
    static_vs_dynamic(make_model("qwen2"), "cpu", decode="static", check_every=check_every)


def test_compiled_static_decode_matches_dynamic() -> None:
    static_vs_dynamic(make_model("qwen2"), "cpu", decode="static", compile=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("compile", [False, True])
def test_cuda_graph_decode_matches_dynamic(compile: bool) -> None:
    static_vs_dynamic(make_model("qwen2"), "cuda", decode="cuda_graph", compile=compile)


def test_decode_mode_errors() -> None:
    model = make_model()
    with pytest.raises(ValueError, match="decode must be"):
        GenerationEngine(model, pad_token_id=PAD, decode="fast")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs a model on a CUDA device"):
            GenerationEngine(model, pad_token_id=PAD, decode="cuda_graph")
    with pytest.raises(ValueError, match="compile=True needs"):
        GenerationEngine(model, pad_token_id=PAD, decode="dynamic", compile=True)
    with pytest.raises(ValueError, match="check_every"):
        GenerationEngine(model, pad_token_id=PAD, check_every=0)


@pytest.mark.parametrize("n", [1, 4])
def test_decode_attention_packs_grouped_heads_like_repeat_kv(n) -> None:
    """``n`` query tokens per row under a mask shared by all heads (decode: 1; a turn's prefill:
    several, causal over the new tokens): queries packed per KV head give sdpa over repeated KV
    heads."""
    b, kv, groups, d, cap = 3, 2, 3, 8, 10
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, length, d, generator=gen) for h, length in ((kv * groups, n), (kv, cap), (kv, cap)))
    mask = torch.zeros(b, 1, n, cap)
    mask[0, ..., 7:] = mask[2, ..., :4] = torch.finfo(torch.float32).min
    causal = torch.ones(n, n, dtype=torch.bool).triu(1)  # the last n columns are the new tokens
    mask[..., cap - n :] = mask[..., cap - n :].masked_fill(causal, torch.finfo(torch.float32).min)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = groups, True
    out, _ = decode_attention(module, q, k, v, mask, scaling=d**-0.5)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), attn_mask=mask, scale=d**-0.5)
    torch.testing.assert_close(out, ref.transpose(1, 2))


@pytest.mark.parametrize("decode", ["dynamic", "static"])
def test_engine_runs_grouped_heads_through_decode_attention(monkeypatch, decode) -> None:
    """Every model call of the engine on an sdpa model (prefills of new and continued sessions,
    decode steps) uses `decode_attention`, and the model is left on plain sdpa afterwards."""
    calls = []

    def counted(module, query, *args, **kwargs):
        calls.append(query.shape[2])
        return decode_attention(module, query, *args, **kwargs)

    monkeypatch.setitem(AttentionInterface._global_mapping, DECODE_ATTENTION, counted)
    model = make_model("qwen2", "sdpa")
    engine = GenerationEngine(model, pad_token_id=PAD, decode=decode)
    params, gen = SamplingParams(temperature=1.0, max_new_tokens=5), torch.Generator().manual_seed(0)
    out = engine.generate([None] * 2, [[1, 2, 3], [4, 5]], params, gen)
    engine.generate([c.context for c in out], [[6, 7], [8]], params, gen)
    layers = model.config.num_hidden_layers
    assert calls.count(3) == 2 * layers  # the two prefills ([pending, 6, 7] is the longest chunk)
    assert calls.count(1) == 2 * 4 * layers  # 4 decode steps a call
    assert model.config._attn_implementation == "sdpa"


def test_two_level_inverse_cdf_matches_one_level_and_skips_zero_weights() -> None:
    gen = torch.Generator().manual_seed(1)
    for vocab in (1000, 1024):  # padded and whole blocks
        logits, u = torch.randn(256, vocab, generator=gen) * 3, torch.rand(256, generator=gen)
        tokens, logprobs = sample_from_logits(logits, 1.0, 1.0, u)
        logp = torch.log_softmax(logits, -1)
        cdf = logp.exp().cumsum(-1)
        ref = torch.searchsorted(cdf, (u[:, None] * cdf[:, -1:]).clamp(max=cdf[:, -1:] * (1 - 1e-7)), right=True)
        assert (tokens == ref.squeeze(-1)).float().mean() > 0.99  # equal but for float ties at bin edges
        torch.testing.assert_close(logprobs, logp.gather(-1, tokens[:, None]).squeeze(-1))
    weights = torch.zeros(3, 300)
    weights[:, 5], weights[:, 299] = 1.0, 2.0  # all but two tokens (and whole blocks) have weight 0
    idx, total = _inverse_cdf(weights, torch.tensor([0.0, 0.5, 1.0 - 1e-7]))
    assert idx.tolist() == [5, 299, 299] and total.tolist() == [3.0] * 3
