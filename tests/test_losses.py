"""Losses against numbers worked out by hand; chunked log-probs against the full computation."""

from __future__ import annotations

import math

import pytest
import torch

from lit_agents.algorithms.losses import (
    cispo_loss,
    kl_estimate,
    kl_loss,
    masked_mean,
    ppo_clip_loss,
    sft_loss,
    token_logprobs,
    token_logprobs_and_entropy,
    token_vocab_kl,
    vocab_kl,
)


def _ppo_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One row; t=0 is masked garbage (ratio e^100), t=1..4 have ratios 1.5, 0.5, 1.0, 0.5."""
    old = torch.tensor([[-50.0, -1.0, -2.0, -0.5, -3.0]])
    ratios = torch.tensor([[1.0, 1.5, 0.5, 1.0, 0.5]])
    logp = (old + ratios.log()).detach()
    logp[0, 0] = 50.0
    adv = torch.tensor([[7.0, 1.0, -1.0, 2.0, 1.0]])
    mask = torch.tensor([[False, True, True, True, True]])
    return logp.requires_grad_(), old, adv, mask


def test_masked_mean_and_normalizer() -> None:
    x = torch.tensor([[1.0, 2.0, float("inf")], [3.0, float("nan"), 4.0]])
    mask = torch.tensor([[True, True, False], [True, False, True]])
    assert masked_mean(x, mask).item() == pytest.approx(10 / 4)
    assert masked_mean(x, mask, normalizer=5.0).item() == pytest.approx(2.0)
    assert masked_mean(x, torch.zeros_like(mask)).item() == 0.0


def test_ppo_clip_hand_values_and_gradients() -> None:
    logp, old, adv, mask = _ppo_inputs()
    out = ppo_clip_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    # per token: r=1.5,A=1 -> -min(1.5, 1.28) = -1.28 (clipped); r=0.5,A=-1 -> -min(-0.5, -0.8)
    # = 0.8 (clipped); r=1,A=2 -> -2; r=0.5,A=1 -> -min(0.5, 0.8) = -0.5. Mean over 4: -0.745.
    assert out.loss.item() == pytest.approx(-0.745, abs=1e-6)
    out.loss.backward()
    # d/dlogp of -r*A/4 is -r*A/4 where unclipped; 0 where clipped and on the masked t=0.
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.0, 0.0, -0.5, -0.125]]))
    assert out.stats["clip_frac"].item() == pytest.approx(0.5)
    # k3(old||new) = r - 1 - ln r: 0.0945349 (r=1.5), 0.1931472 (r=0.5, twice), 0 -> mean 0.1202073
    assert out.stats["approx_kl"].item() == pytest.approx(0.1202073, abs=1e-6)
    assert out.stats["ratio_mean"].item() == pytest.approx(0.875, abs=1e-6)
    assert out.stats["ratio_max"].item() == pytest.approx(1.5, abs=1e-6)
    assert all(not v.requires_grad and v.dim() == 0 for v in out.stats.values())


def test_ppo_clip_normalizer_and_row_advantages() -> None:
    logp, old, adv, mask = _ppo_inputs()
    # Dr.-GRPO normalizer: the masked sum -2.98 over the constant 8.
    out = ppo_clip_loss(logp, old, adv, mask, normalizer=8.0)
    assert out.loss.item() == pytest.approx(-0.3725, abs=1e-6)
    # [B] advantages broadcast over tokens: A=1 everywhere -> -1.28, -0.5, -1, -0.5 -> -0.82.
    row = ppo_clip_loss(logp, old, torch.tensor([1.0]), mask)
    assert row.loss.item() == pytest.approx(-0.82, abs=1e-6)
    full = ppo_clip_loss(logp, old, torch.ones(1, 5), mask)
    assert row.loss.item() == pytest.approx(full.loss.item())


def test_cispo_hand_values_and_gradient() -> None:
    # ratios 7, 2, 0.5 (7 clipped to 5); A = 1, -1, 2; logp = -0.5, -1, -2.
    logp = torch.tensor([[0.0, -0.5, -1.0, -2.0]], requires_grad=True)
    ratios = torch.tensor([[1.0, 7.0, 2.0, 0.5]])
    old = logp.detach() - ratios.log()
    adv = torch.tensor([[0.0, 1.0, -1.0, 2.0]])
    mask = torch.tensor([[False, True, True, True]])
    out = cispo_loss(logp, old, adv, mask, max_ratio=5.0)
    # -5*1*(-0.5) = 2.5; -2*(-1)*(-1) = -2; -0.5*2*(-2) = 2 -> mean 2.5/3.
    assert out.loss.item() == pytest.approx(2.5 / 3, abs=1e-6)
    out.loss.backward()
    # gradient -clip(r)*A/n: -5/3, 2/3, -1/3 (and 0 on the masked t=0).
    expected = torch.tensor([[0.0, -5 / 3, 2 / 3, -1 / 3]])
    torch.testing.assert_close(logp.grad, expected)
    assert out.stats["clip_frac"].item() == pytest.approx(1 / 3)
    assert out.stats["ratio_mean"].item() == pytest.approx(9.5 / 3, abs=1e-5)
    assert out.stats["ratio_max"].item() == pytest.approx(7.0, abs=1e-5)


def test_kl_estimators_hand_values() -> None:
    logp = torch.tensor([[-1.0, -2.0, -0.7]])
    ref = torch.tensor([[-2.0, -1.0, -0.7]])
    # logp - ref = 1, -1, 0.
    torch.testing.assert_close(kl_estimate(logp, ref, "k1"), torch.tensor([[1.0, -1.0, 0.0]]))
    torch.testing.assert_close(kl_estimate(logp, ref, "k2"), torch.tensor([[0.5, 0.5, 0.0]]))
    # k3: exp(-1) + 1 - 1 = 0.3678794; exp(1) - 1 - 1 = 0.7182818; 0.
    k3 = kl_estimate(logp, ref, "k3")
    torch.testing.assert_close(k3, torch.tensor([[0.3678794, 0.7182818, 0.0]]))
    for kind in ("k1", "k2", "k3"):
        assert kl_estimate(ref, ref, kind).eq(0).all()  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="k4"):
        kl_estimate(logp, ref, "k4")  # type: ignore[arg-type]


def test_vocab_kl_is_the_exact_kl_with_a_zero_gradient_at_the_reference() -> None:
    torch.manual_seed(0)
    logits, ref_logits = torch.randn(3, 5, 11), torch.randn(3, 5, 11)
    logp = logits.log_softmax(-1).requires_grad_()
    ref = ref_logits.log_softmax(-1)
    expected = torch.nn.functional.kl_div(ref, logp.detach(), log_target=True, reduction="none").sum(-1)
    assert torch.allclose(vocab_kl(logp, ref), expected, atol=1e-6) and (expected > 0).all()
    same = logits.clone().requires_grad_()
    vocab_kl(same.log_softmax(-1), same.detach().log_softmax(-1)).sum().backward()
    assert same.grad.abs().max() < 1e-6  # KL's minimum: no push at all when pi = ref
    # a zero-probability token contributes 0, not nan
    sparse = torch.tensor([[0.0, float("-inf")]])
    assert vocab_kl(sparse, torch.tensor([[-0.1, -2.3]])).item() == pytest.approx(0.1)


def test_token_vocab_kl_matches_full_and_masks() -> None:
    torch.manual_seed(1)
    hidden, ref_hidden = torch.randn(2, 6, 8, requires_grad=True), torch.randn(2, 6, 8)
    w, ref_w = torch.randn(13, 8), torch.randn(13, 8)
    mask = torch.tensor([[0, 0, 1, 1, 0, 1], [0, 1, 1, 0, 0, 0]], dtype=torch.bool)
    got = token_vocab_kl(hidden, ref_hidden, w, ref_w, mask, chunk_size=2, temperature=0.7)
    full = vocab_kl((hidden @ w.T / 0.7).log_softmax(-1), (ref_hidden @ ref_w.T / 0.7).log_softmax(-1))
    expected = torch.zeros(2, 6)
    expected[:, 1:] = full[:, :-1] * mask[:, 1:]  # the state at t-1 predicts token t
    assert torch.allclose(got, expected, atol=1e-5)
    got.sum().backward()
    assert hidden.grad[:, -1].abs().sum() == 0 and hidden.grad[0, 1].abs().sum() > 0


def test_kl_loss_masks_padding() -> None:
    logp = torch.tensor([[80.0, -1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-80.0, -2.0, -1.0]])
    out = kl_loss(logp, ref, torch.tensor([[False, True, True]]), kind="k3")
    assert out.loss.item() == pytest.approx((0.3678794 + 0.7182818) / 2, abs=1e-6)
    out.loss.backward()
    # d k3 / d logp = 1 - exp(ref - logp): 1 - e^-1 = 0.6321206, 1 - e = -1.7182818; /2.
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.3160603, -0.8591409]]))


def test_k3_clamp_bounds_the_gradient_of_a_token_far_below_the_reference() -> None:
    # a SmolLM2 RL run at lr 1e-3: one step drove a sampled token from logp -3.0 to -15.8 (reference -3.5); k3's
    # gradient there is 1 - exp(12.3), about -2.3e5, and it made the step's gradient
    logp = torch.tensor([[-15.8, -1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-3.5, -2.0, -2.0]])
    k3 = kl_estimate(logp, ref, "k3")
    capped = kl_estimate(logp, ref, "k3_clamp")
    assert k3[0, 0] > 1e5 and capped[0, 0] == 10.0  # capped
    torch.testing.assert_close(capped[0, 1:], k3[0, 1:])  # below the cap: k3 itself
    capped.sum().backward()
    # past the cap no gradient; below it k3's 1 - exp(ref - logp) = 1 - e^-1
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.6321206, 0.0]]))
    assert kl_estimate(ref, ref, "k3_clamp").eq(0).all()


def test_sft_loss() -> None:
    logp = torch.tensor([[-100.0, -1.0, -2.0], [-50.0, -3.0, 0.0]])
    mask = torch.tensor([[False, True, True], [False, True, False]])
    out = sft_loss(logp, mask)
    assert out.loss.item() == pytest.approx(2.0)  # (1 + 2 + 3) / 3
    assert out.stats["nll"].item() == pytest.approx(2.0)
    assert out.stats["ppl"].item() == pytest.approx(7.3890561, abs=1e-5)
    assert out.stats["tokens"].item() == 3
    norm = sft_loss(logp, mask, normalizer=6.0)
    assert norm.loss.item() == pytest.approx(1.0)
    assert norm.stats["nll"].item() == pytest.approx(2.0)


# --- token_logprobs ------------------------------------------------------------------------


def _full_logprobs(hidden, weight, ids, bias=None, temperature=1.0):
    """Reference: the whole [B, T, V] logits at once."""
    logits = hidden[:, :-1] @ weight.T
    if bias is not None:
        logits = logits + bias
    logp = (logits / temperature).log_softmax(-1)
    picked = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    return torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1), logp


def _leaves(B=2, T=6, H=8, V=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=g).requires_grad_()
    weight = torch.randn(V, H, generator=g).requires_grad_()
    bias = torch.randn(V, generator=g).requires_grad_()
    ids = torch.randint(0, V, (B, T), generator=g)
    return hidden, weight, bias, ids


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 10, 1024])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_matches_full(chunk_size: int, temperature: float) -> None:
    hidden, weight, bias, ids = _leaves()
    ref, _ = _full_logprobs(hidden, weight, ids, bias, temperature)
    ref_grads = torch.autograd.grad((ref * ref.detach().cos()).sum(), (hidden, weight, bias))
    out = token_logprobs(hidden, weight, ids, bias, chunk_size=chunk_size, temperature=temperature)
    assert out.shape == (2, 6) and out.dtype == torch.float32
    assert out[:, 0].eq(0).all()
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    grads = torch.autograd.grad((out * out.detach().cos()).sum(), (hidden, weight, bias))
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_token_logprobs_mask_entropy_and_no_grad() -> None:
    hidden, weight, _, ids = _leaves()
    ref, ref_all = _full_logprobs(hidden, weight, ids)
    mask = torch.tensor(
        [[False, False, True, True, False, True], [False, True, False, True, True, True]]
    )
    out = token_logprobs(hidden, weight, ids, chunk_size=2, mask=mask)
    torch.testing.assert_close(out, torch.where(mask, ref, 0.0), atol=1e-5, rtol=1e-5)
    g_out = torch.autograd.grad(out.sum(), hidden)[0]
    g_ref = torch.autograd.grad(torch.where(mask, ref, 0.0).sum(), hidden)[0]
    torch.testing.assert_close(g_out, g_ref, atol=1e-5, rtol=1e-5)

    logp, entropy = token_logprobs_and_entropy(hidden, weight, ids, chunk_size=4)
    ref_ent = -(ref_all.exp() * ref_all).sum(-1)
    torch.testing.assert_close(logp, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy[:, 1:], ref_ent, atol=1e-5, rtol=1e-5)
    assert entropy[:, 0].eq(0).all()

    with torch.no_grad():
        frozen = token_logprobs(hidden, weight, ids, chunk_size=3)
    assert not frozen.requires_grad
    torch.testing.assert_close(frozen, ref.detach(), atol=1e-5, rtol=1e-5)


def test_token_logprobs_frozen_head_and_bf16() -> None:
    hidden, weight, _, ids = _leaves()
    ref, _ = _full_logprobs(hidden, weight, ids)
    out = token_logprobs(hidden, weight.detach(), ids, chunk_size=5)
    g_out = torch.autograd.grad(out.sum(), hidden)[0]
    g_ref = torch.autograd.grad(ref.sum(), hidden)[0]
    torch.testing.assert_close(g_out, g_ref, atol=1e-5, rtol=1e-5)
    half = token_logprobs(hidden.bfloat16(), weight.bfloat16(), ids, chunk_size=5)
    assert half.dtype == torch.float32
    torch.testing.assert_close(half, ref.detach(), atol=0.1, rtol=0.05)
    single = token_logprobs(hidden[:, :1], weight, ids[:, :1])
    assert single.shape == (2, 1) and single.eq(0).all()


def _saved_numels(fn) -> tuple[list[int], int]:
    """Numel of every tensor saved for backward, and the bytes of their distinct storages."""
    sizes: list[int] = []
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        sizes.append(t.numel())
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sizes, sum(storages.values())


def test_token_logprobs_never_saves_full_logits() -> None:
    B, T, H, V, chunk = 2, 64, 16, 500, 8
    hidden, weight, _, ids = _leaves(B=B, T=T, H=H, V=V)
    full_logits = B * (T - 1) * V
    # The hook does see a [B, T, V] tensor when the logits are built whole ...
    naive, _ = _saved_numels(lambda: _full_logprobs(hidden, weight, ids)[0].sum().backward())
    assert max(naive) >= full_logits
    # ... and nothing of that size from the chunked version: each chunk keeps only its inputs (a
    # view of the hidden states, the shared weight, the targets) and one log-sum-exp per position.
    sizes, saved_bytes = _saved_numels(
        lambda: token_logprobs(hidden, weight, ids, chunk_size=chunk).sum().backward()
    )
    assert max(sizes) <= max(V * H, B * T * H)
    assert saved_bytes <= 4 * (V * H + B * T * H) + 8 * B * T + 4 * B * T  # weight, hidden, targets, lse
    assert saved_bytes < 4 * full_logits / 4
    assert hidden.grad is not None and weight.grad is not None


def test_token_logprobs_validation() -> None:
    hidden, weight, _, ids = _leaves()
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs(hidden, weight, ids, chunk_size=0)
    with pytest.raises(ValueError, match=r"\[B, T, H\]"):
        token_logprobs(hidden, weight, ids[:, :3])
    assert math.isfinite(token_logprobs(hidden, weight, ids).sum().item())


# ---------------------------------------------------------------- Multi2 actor-critic (hand-computed)


def test_td_targets_include_terminal_transitions():
    from lit_agents.algorithms.losses import td_targets

    r, v_next, done = torch.tensor([0.0, 1.0, 0.5]), torch.tensor([2.0, 3.0, -1.0]), torch.tensor([0, 1, 0])
    # 0 + 0.9*2 = 1.8; terminal: 1 (no bootstrap); 0.5 + 0.9*(-1) = -0.4
    assert torch.allclose(td_targets(r, v_next, done, gamma=0.9), torch.tensor([1.8, 1.0, -0.4]))


def test_expectile_loss_by_hand():
    from lit_agents.algorithms.losses import expectile_loss

    diff = torch.tensor([2.0, -1.0])  # weights 0.7 and 0.3: (0.7*4 + 0.3*1) / 2 = 1.55
    assert expectile_loss(diff, 0.7).item() == pytest.approx(1.55)
    assert expectile_loss(diff, 0.5).item() == pytest.approx(0.5 * (4 + 1) / 2)
    with pytest.raises(ValueError):
        expectile_loss(diff, 1.0)


def test_policy_anchored_weights_by_hand():
    from lit_agents.algorithms.losses import policy_anchored_weights

    adv = torch.tensor([0.1, -0.1, 1.0])
    # raw: 7*0.1 + e^1 = 3.41828; 0 + e^-1 = 0.36788; 7 + min(e^10, 20) = 27
    raw = torch.tensor([0.7 + math.e, math.exp(-1), 27.0])
    w = policy_anchored_weights(adv, lam=7.0, beta=10.0, clip=20.0)
    assert torch.allclose(w, raw / raw.mean(), atol=1e-6)
    assert w.mean().item() == pytest.approx(1.0)


def test_awac_weights_by_hand_and_per_episode():
    from lit_agents.algorithms.losses import awac_weights

    adv = torch.tensor([0.0, math.log(3.0), 0.0, 0.0])
    # global: raw [1, 3, 1, 1] / mean 1.5
    assert torch.allclose(awac_weights(adv), torch.tensor([2 / 3, 2.0, 2 / 3, 2 / 3]))
    # per episode: ep 0 = [1, 3] / 2 -> [0.5, 1.5]; ep 1 = [1, 1] -> [1, 1]
    w = awac_weights(adv, episode_ids=torch.tensor([5, 5, 9, 9]))
    assert torch.allclose(w, torch.tensor([0.5, 1.5, 1.0, 1.0]))
    # capped after normalizing: raw [1, e^20] / mean -> ~[0, 2]; cap 1.5
    capped = awac_weights(torch.tensor([0.0, 40.0]), alpha=2.0, clip=1.5)
    assert capped.max().item() == pytest.approx(1.5)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_and_entropy_gradients(temperature: float) -> None:
    """The entropy pass gives token_logprobs' gradients (hidden, head, bias) and none of its own."""
    hidden, weight, bias, ids = _leaves(T=9, V=13, seed=3)
    mask = torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)) > 0.3
    ref, ref_all = _full_logprobs(hidden, weight, ids, bias, temperature)
    ref = torch.where(mask, ref, 0.0)
    want = torch.autograd.grad((ref * ref.detach().sin()).sum(), (hidden, weight, bias))
    logp, entropy = token_logprobs_and_entropy(hidden, weight, ids, bias, chunk_size=4,
                                               temperature=temperature, mask=mask)
    torch.testing.assert_close(logp, ref, atol=1e-5, rtol=1e-5)
    ent = -(ref_all.exp() * ref_all).sum(-1)
    torch.testing.assert_close(entropy[:, 1:], torch.where(mask[:, 1:], ent, 0.0), atol=1e-5, rtol=1e-5)
    assert not entropy.requires_grad
    got = torch.autograd.grad((logp * logp.detach().sin()).sum(), (hidden, weight, bias))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_token_logprobs_under_autocast_matches_bf16_matmul() -> None:
    """Under bf16 autocast the head's matmul runs in bf16 both ways, the softmax in fp32; the
    gradient reaches an fp32 hidden state in fp32."""
    hidden, weight, _, ids = _leaves(T=8, V=17, seed=5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = token_logprobs(hidden, weight, ids, chunk_size=3)
        g_h, g_w = torch.autograd.grad(out.sum(), (hidden, weight))
    assert out.dtype == torch.float32 and g_h.dtype == torch.float32 and g_w.dtype == torch.float32
    ref, _ = _full_logprobs(hidden.bfloat16().float(), weight.bfloat16().float(), ids)
    torch.testing.assert_close(out, ref.detach(), atol=2e-2, rtol=2e-2)
    r_h, r_w = torch.autograd.grad(ref.sum(), (hidden, weight))
    torch.testing.assert_close(g_h, r_h, atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(g_w, r_w, atol=5e-2, rtol=5e-2)
