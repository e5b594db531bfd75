"""Policy-gradient, KL and SFT losses, and memory-bounded token log-probs.

Pure functions over per-token tensors (docs/algorithms.md, Losses). Shapes:
``B`` rows, ``T`` tokens; index ``t`` describes token ``t`` (``collate.collate_rows`` aligns every
tensor that way, and ``token_logprobs`` gives ``log p(token_t | tokens_<t)`` at index ``t``).
``mask: [B, T]`` is True on the tokens that are trained (generated tokens, SFT targets).

Every loss returns ``LossOutput(loss, stats)``: a scalar to backpropagate and detached scalar
diagnostics named without a prefix (the module logs them under ``train/``).

Implemented:

- ``ppo_clip_loss``: PPO-clip with decoupled clip range (DAPO's clip-higher, arXiv 2503.14476:
  ``eps_low=0.2``, ``eps_high=0.28``).
- ``cispo_loss``: CISPO (MiniMax-M1, arXiv 2506.13585), RAO's choice: a REINFORCE loss weighted
  by the stop-gradient importance ratio clipped to ``[0, max_ratio]``. The paper clips only above
  (``1 + eps_high``); the lower bound 0 here is a no-op (docs/algorithms.md, Losses).
- ``engine_is_weights``: truncated (TIS) or masked (MIS) importance weights for the rollout engine's
  mismatch with the trainer (vLLM's log-probs differ from the trainer's: kernels, precision).
- ``kl_estimate`` / ``kl_loss``: k1, k2, k3 estimators of ``KL(pi || ref)`` with samples from pi
  (Schulman, "Approximating KL divergence", 2020).
- ``sft_loss``: mean NLL over target tokens.
- Multi2's System 2 actor-critic, per action (tensors ``[N]``): ``td_targets`` (terminal
  transitions included), ``expectile_loss`` (V toward Q), ``policy_anchored_weights`` (offline
  actor) and ``awac_weights`` (online actor), as in docs/algorithms.md, Multi2.
- ``token_logprobs``: log-probs of the given ids from last hidden states, in chunks whose
  logits the backward recomputes, so the ``[B, T, V]`` logits never exist whole.

Normalization: by default a loss is the mean over the mask's tokens (token-mean over the batch);
``normalizer=c`` divides the masked sum by the constant ``c`` instead (Dr. GRPO, arXiv
2503.20783), which removes the length bias of per-batch token counts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from lit_agents.algorithms.advantages import group_stats

__all__ = [
    "LossOutput",
    "KLKind",
    "masked_mean",
    "ppo_clip_loss",
    "cispo_loss",
    "EngineCorrection",
    "engine_is_weights",
    "kl_estimate",
    "kl_loss",
    "vocab_kl",
    "token_vocab_kl",
    "sft_loss",
    "td_targets",
    "expectile_loss",
    "policy_anchored_weights",
    "awac_weights",
    "token_logprobs",
    "token_logprobs_and_entropy",
]

KLKind = Literal["k1", "k2", "k3", "k3_clamp"]


class LossOutput(NamedTuple):
    """A loss and its diagnostics.

    Attributes:
        loss: scalar tensor to backpropagate.
        stats: detached scalar tensors (``clip_frac``, ``approx_kl``, ...).
    """

    loss: Tensor
    stats: dict[str, Tensor]


def masked_mean(x: Tensor, mask: Tensor, normalizer: float | None = None) -> Tensor:
    """Mean of ``x`` over the True entries of ``mask``.

    Entries outside the mask are ignored even when they are inf or nan (no nan leaks into values
    or gradients). With no True entry the result is 0.

    Args:
        x: ``[B, T]`` (any shape matching ``mask``).
        mask: ``[B, T]`` bool.
        normalizer: if given, divide the masked sum by this constant instead of the token count.

    Returns:
        Scalar tensor.
    """
    mask = mask.bool()
    total = torch.where(mask, x, torch.zeros_like(x)).sum()
    if normalizer is not None:
        if normalizer <= 0:
            raise ValueError(f"normalizer must be positive, got {normalizer}")
        return total / normalizer
    return total / mask.sum().clamp(min=1)


def _broadcast_advantages(advantages: Tensor, like: Tensor) -> Tensor:
    """``[B]`` or ``[B, T]`` advantages as ``[B, T]`` (detached: advantages are targets)."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    return advantages.detach().to(like.dtype).expand_as(like)


def _masked_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """``logp - sg(old_logp)`` on the mask, 0 elsewhere (``exp`` never overflows on padding)."""
    return torch.where(mask, logp - old_logp.detach(), torch.zeros_like(logp))


def _ratio_stats(log_ratio: Tensor, mask: Tensor, clipped: Tensor) -> dict[str, Tensor]:
    """Detached diagnostics of the importance ratio over the mask (all scalars)."""
    with torch.no_grad():
        log_ratio = log_ratio.detach().float()
        ratio = log_ratio.exp()
        approx_kl = ratio - 1.0 - log_ratio  # k3 estimate of KL(old || new), samples from old
        return {
            "clip_frac": masked_mean(clipped.float(), mask),
            "approx_kl": masked_mean(approx_kl, mask),
            "ratio_mean": masked_mean(ratio, mask),
            "ratio_max": torch.where(mask, ratio, torch.zeros_like(ratio)).max(),
        }


def ppo_clip_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    normalizer: float | None = None,
) -> LossOutput:
    """PPO clipped surrogate: ``-min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)``.

    Args:
        logp: ``[B, T]`` log-probs of the tokens under the current policy (with grad).
        old_logp: ``[B, T]`` log-probs under the sampling policy.
        advantages: ``[B, T]`` per-token or ``[B]`` per-row advantages.
        mask: ``[B, T]`` bool, True on trained tokens.
        eps_low: lower clip range.
        eps_high: upper clip range.
        normalizer: constant divisor instead of the token count (see ``masked_mean``).

    Returns:
        ``LossOutput``; stats ``clip_frac`` (fraction of tokens whose gradient the clip removes),
        ``approx_kl`` (k3 of old vs new), ``ratio_mean``, ``ratio_max``.
    """
    mask = mask.bool()
    adv = _broadcast_advantages(advantages, logp)
    log_ratio = _masked_log_ratio(logp, old_logp, mask)
    ratio = log_ratio.exp()
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    loss = masked_mean(-torch.minimum(unclipped, clipped), mask, normalizer)
    was_clipped = ((ratio > 1.0 + eps_high) & (adv > 0)) | ((ratio < 1.0 - eps_low) & (adv < 0))
    return LossOutput(loss, _ratio_stats(log_ratio, mask, was_clipped))


def cispo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    max_ratio: float = 5.0,
    normalizer: float | None = None,
) -> LossOutput:
    """CISPO: ``-sg(clip(ratio, 0, max_ratio)) * A * logp``.

    Every token keeps a gradient (the clipped ratio is only a weight), unlike PPO-clip.

    Args:
        logp: ``[B, T]`` log-probs under the current policy (with grad).
        old_logp: ``[B, T]`` log-probs under the sampling policy.
        advantages: ``[B, T]`` per-token or ``[B]`` per-row advantages.
        mask: ``[B, T]`` bool, True on trained tokens.
        max_ratio: upper clip of the importance weight.
        normalizer: constant divisor instead of the token count (see ``masked_mean``).

    Returns:
        ``LossOutput``; stats ``clip_frac`` (fraction of tokens with ratio above ``max_ratio``),
        ``approx_kl``, ``ratio_mean``, ``ratio_max``.
    """
    mask = mask.bool()
    adv = _broadcast_advantages(advantages, logp)
    log_ratio = _masked_log_ratio(logp, old_logp, mask)
    weight = log_ratio.detach().exp().clamp(0.0, max_ratio)
    safe_logp = torch.where(mask, logp, torch.zeros_like(logp))
    loss = masked_mean(-weight * adv * safe_logp, mask, normalizer)
    return LossOutput(loss, _ratio_stats(log_ratio, mask, log_ratio.exp() > max_ratio))


EngineCorrection = Literal["none", "tis", "mis"]


def engine_is_weights(
    trainer_logp: Tensor,
    sampler_logp: Tensor,
    mask: Tensor,
    mode: EngineCorrection = "tis",
    cap: float = 2.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token importance weights for the sampling engine's mismatch with the trainer.

    A token was sampled from the engine's distribution, while the loss's ratio is taken against
    the trainer's log-probs of the same weights; ``rho = exp(trainer_logp - sampler_logp)``
    reweighs each token from the engine's distribution to the trainer's:

    - ``"tis"``: truncated importance sampling, ``min(rho, cap)`` (Yao et al. 2025, "Your
      Efficient RL Framework Secretly Brings You Off-Policy RL Training");
    - ``"mis"``: masked importance sampling, ``rho`` where ``rho <= cap``, else 0: the tokens the
      engine over-sampled by more than ``cap`` are dropped from the gradient (Liu, Li et al. 2025,
      "When Speed Kills Stability");
    - ``"none"``: 1 (the weights are still measured).

    Args:
        trainer_logp: ``[B, T]`` the trainer's log-probs of the sampled tokens (same weights).
        sampler_logp: ``[B, T]`` the engine's log-probs of them.
        mask: ``[B, T]`` bool, True on trained tokens.
        mode: which correction.
        cap: ``C``, the truncation (TIS) or masking (MIS) threshold; at least 1.

    Returns:
        ``[B, T]`` detached weights (0 off the mask) and stats: ``engine_kl`` (k3 estimate of
        ``KL(engine || trainer)`` from the engine's tokens, ``rho - 1 - log rho``),
        ``engine_ratio_mean``, ``engine_ratio_max`` and ``engine_masked_frac`` (the share of
        tokens with ``rho > cap``: truncated under TIS, masked under MIS).
    """
    if mode not in ("none", "tis", "mis"):
        raise ValueError(f"mode must be 'none', 'tis' or 'mis', got {mode!r}")
    if cap < 1.0:
        raise ValueError(f"cap must be at least 1, got {cap}")
    with torch.no_grad():
        mask = mask.bool()
        log_rho = torch.where(mask, trainer_logp.float() - sampler_logp.float(), torch.zeros_like(trainer_logp))
        rho = log_rho.exp()
        over = (rho > cap) & mask
        if mode == "tis":
            weights = rho.clamp(max=cap)
        elif mode == "mis":
            weights = torch.where(over, torch.zeros_like(rho), rho)
        else:
            weights = torch.ones_like(rho)
        stats = {
            "engine_kl": masked_mean(torch.expm1(log_rho) - log_rho, mask),
            "engine_ratio_mean": masked_mean(rho, mask),
            "engine_ratio_max": torch.where(mask, rho, torch.zeros_like(rho)).max(),
            "engine_masked_frac": masked_mean(over.float(), mask),
        }
        return torch.where(mask, weights, torch.zeros_like(weights)), stats


def _k1(log_ratio: Tensor) -> Tensor:
    return log_ratio


def _k2(log_ratio: Tensor) -> Tensor:
    return 0.5 * log_ratio**2


def _k3(log_ratio: Tensor) -> Tensor:
    neg = -log_ratio  # ref - logp
    return torch.expm1(neg) - neg


def _k3_clamp(log_ratio: Tensor) -> Tensor:
    # verl's low_var_kl: the log-ratio within +-20, the estimate at most 10. Tokens past the cap add
    # no gradient, where k3's ``1 - exp(ref - logp)`` grows without bound (docs/results.md, Quick start).
    return _k3(log_ratio.clamp(-20.0, 20.0)).clamp(max=10.0)


_KL_ESTIMATORS: dict[str, Callable[[Tensor], Tensor]] = {"k1": _k1, "k2": _k2, "k3": _k3, "k3_clamp": _k3_clamp}


def _check_kl_kind(kind: str) -> None:
    if kind not in _KL_ESTIMATORS:
        raise ValueError(f"kind must be one of {sorted(_KL_ESTIMATORS)}, got {kind!r}")


def kl_estimate(logp: Tensor, ref_logp: Tensor, kind: KLKind = "k3") -> Tensor:
    """Per-token estimate of ``KL(pi || ref)`` from tokens sampled from pi.

    k1 ``logp - ref`` (unbiased, high variance, can be negative); k2 ``0.5 * (logp - ref)^2``;
    k3 ``exp(ref - logp) - (ref - logp) - 1`` (unbiased, non-negative); k3_clamp k3 capped at 10
    (bounded gradient; biased where the policy is far below the reference). All are 0 where
    ``logp == ref``.

    Args:
        logp: ``[B, T]`` log-probs under the policy.
        ref_logp: ``[B, T]`` log-probs under the reference (no grad is taken through it).
        kind: which estimator.

    Returns:
        ``[B, T]`` per-token estimates.
    """
    _check_kl_kind(kind)
    return _KL_ESTIMATORS[kind](logp - ref_logp.detach())


def vocab_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Exact ``KL(p || ref)`` per position, summed over the vocabulary.

    Unlike the sampled-token estimators (`kl_estimate`), its gradient is the KL's gradient at
    any position, whoever sampled the token there: the one to use on off-policy rows (a replay
    buffer's actions), where ``k1``'s gradient is ``grad logp`` whatever the reference says.

    Args:
        logp: ``[..., V]`` log-softmax of the policy.
        ref_logp: ``[..., V]`` log-softmax of the reference (no grad is taken through it).

    Returns:
        ``[...]`` non-negative KL per position; 0 with a 0 gradient where the two are equal.
    """
    ref = ref_logp.detach()
    low = torch.finfo(logp.dtype).min
    # p = 0 contributes 0 (0 * -inf would be nan); ref = -inf where p > 0 is an infinite KL
    return (logp.exp() * (logp.clamp(min=low) - ref.clamp(min=low))).sum(-1)


def token_vocab_kl(
    hidden: Tensor,
    ref_hidden: Tensor,
    lm_head_weight: Tensor,
    ref_lm_head_weight: Tensor,
    mask: Tensor,
    lm_head_bias: Tensor | None = None,
    ref_lm_head_bias: Tensor | None = None,
    chunk_size: int = 1024,
    temperature: float = 1.0,
) -> Tensor:
    """`vocab_kl` of the distributions that predict each masked token, in chunks.

    ``out[:, t] = KL(softmax(hidden[:, t-1] @ W.T) || softmax(ref_hidden[:, t-1] @ W_ref.T))``
    where ``mask[:, t]``, else 0. Only ``[chunk_size, V]`` logits of each side exist at once
    (recomputed in the backward under ``torch.utils.checkpoint``).

    Args:
        hidden: ``[B, T, H]`` the policy's last hidden states (after the final norm).
        ref_hidden: ``[B, T, H']`` the reference's (no grad is taken through it).
        lm_head_weight, ref_lm_head_weight: ``[V, H]``, ``[V, H']`` output embeddings.
        mask: ``[B, T]`` bool, the positions whose predicting distributions are compared.
        lm_head_bias, ref_lm_head_bias: output biases, if the heads have them.
        chunk_size: positions per chunk.
        temperature: applied to both sides' logits.

    Returns:
        ``[B, T]`` float32.
    """
    if hidden.shape[:2] != ref_hidden.shape[:2] or hidden.shape[:2] != mask.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)}, ref_hidden {tuple(ref_hidden.shape)} and mask "
                         f"{tuple(mask.shape)} must share [B, T]")
    H = hidden.shape[-1]
    ref_w = ref_lm_head_weight.detach()
    ref_b = None if ref_lm_head_bias is None else ref_lm_head_bias.detach()

    def chunk(h: Tensor, weight: Tensor, bias: Tensor | None, _targets: Tensor, temp: float) -> Tensor:
        logp = _head_logits(h[:, :H], weight, bias, temp, _matmul_dtype(h, weight)).log_softmax(-1)
        return vocab_kl(logp, _head_logits(h[:, H:], ref_w, ref_b, temp, _matmul_dtype(h, ref_w)).log_softmax(-1))

    # `_chunked` selects, chunks and checkpoints the predicting positions of one hidden tensor:
    # both sides' states ride in it side by side (no gradient reaches the reference's half)
    both = torch.cat([hidden, ref_hidden.detach().to(hidden.dtype)], dim=-1)
    no_targets = torch.zeros(mask.shape, dtype=torch.long, device=mask.device)
    return _chunked(chunk, (), both, lm_head_weight, no_targets, lm_head_bias, chunk_size, temperature, mask,
                    recompute=True)


def kl_loss(
    logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    kind: KLKind = "k3",
    normalizer: float | None = None,
) -> LossOutput:
    """Masked mean of ``kl_estimate`` as a loss term (the caller multiplies by its coefficient).

    Args:
        logp: ``[B, T]`` log-probs under the policy.
        ref_logp: ``[B, T]`` log-probs under the reference.
        mask: ``[B, T]`` bool, True on the tokens the penalty applies to.
        kind: which estimator.
        normalizer: constant divisor instead of the token count (see ``masked_mean``).

    Returns:
        ``LossOutput``; stats ``kl`` (the token-mean estimate, detached).
    """
    _check_kl_kind(kind)
    mask = mask.bool()
    per_token = _KL_ESTIMATORS[kind](_masked_log_ratio(logp, ref_logp, mask))
    loss = masked_mean(per_token, mask, normalizer)
    return LossOutput(loss, {"kl": masked_mean(per_token.detach(), mask)})


def sft_loss(logp: Tensor, mask: Tensor, normalizer: float | None = None) -> LossOutput:
    """Negative log-likelihood of the target tokens (prompt tokens masked out).

    Args:
        logp: ``[B, T]`` log-probs of the tokens.
        mask: ``[B, T]`` bool, True on target tokens.
        normalizer: constant divisor instead of the token count (see ``masked_mean``).

    Returns:
        ``LossOutput``; stats ``nll`` (token-mean NLL, whatever the normalizer), ``ppl``
        (``exp(nll)``), ``tokens`` (number of target tokens).
    """
    mask = mask.bool()
    loss = masked_mean(-logp, mask, normalizer)
    with torch.no_grad():
        nll = masked_mean(-logp.detach().float(), mask)
        stats = {"nll": nll, "ppl": nll.exp(), "tokens": mask.sum().float()}
    return LossOutput(loss, stats)


# ---------------------------------------------------------------------------------------------
# Multi2 System 2: actor-critic over actions (one value per action, tensors [N]).


def td_targets(rewards: Tensor, next_values: Tensor, dones: Tensor, gamma: float = 0.99) -> Tensor:
    """One-step TD targets ``r + gamma * (1 - done) * V(s')``, terminal transitions included
    (their target is the reward alone). Returned detached."""
    return (rewards + gamma * (1.0 - dones.float()) * next_values).detach()


def expectile_loss(diff: Tensor, kappa: float = 0.7) -> Tensor:
    """Expectile regression: mean of ``|kappa - 1[diff < 0]| * diff**2`` with ``diff = target -
    prediction`` (IQL's V loss; ``kappa > 0.5`` leans V toward the upper expectile of Q)."""
    if not 0.0 < kappa < 1.0:
        raise ValueError(f"kappa must be in (0, 1), got {kappa}")
    weight = torch.where(diff < 0, 1.0 - kappa, kappa)
    return (weight * diff.square()).mean()


def policy_anchored_weights(adv: Tensor, lam: float = 7.0, beta: float = 10.0, clip: float = 20.0) -> Tensor:
    """Multi2's offline actor weights ``lam * relu(A) + min(exp(beta * A), clip)``, normalized to
    mean 1 over the batch (detached)."""
    adv = adv.detach().float()
    w = lam * adv.clamp(min=0) + torch.exp((beta * adv).clamp(max=math.log(clip)))
    return w / w.mean().clamp(min=1e-8)


def awac_weights(adv: Tensor, alpha: float = 1.0, clip: float = 20.0, episode_ids: Tensor | None = None) -> Tensor:
    """AWAC weights ``exp(clip(A / alpha, -20, 20))`` normalized to mean 1 (per episode when
    ``episode_ids`` are given), then capped at ``clip`` (detached)."""
    w = torch.exp((adv.detach().float() / alpha).clamp(-20.0, 20.0))
    if episode_ids is None:
        w = w / w.mean()
    else:
        w = w / group_stats(w, episode_ids).mean.to(w.dtype)
    return w.clamp(max=clip)


# ---------------------------------------------------------------------------------------------
# Token log-probs from hidden states, chunked.


class _HeadLogProb(torch.autograd.Function):
    """Log-probs of ``targets`` (and, on request, the entropies) of one chunk of hidden states
    through the output layer, saving no logits: the backward recomputes the ``[n, V]`` logits
    once and forms ``d logp / d logits = onehot(target) - softmax`` in place (the fused
    linear-cross-entropy backward), a handful of vocabulary-sized passes where autograd through
    ``log_softmax`` + ``gather`` (+ the entropy's terms) under checkpointing took about three
    times as many. The matmuls run in ``dtype`` both ways (the autocast dtype, or the
    weight's), the softmax in float32. Returns ``(logp [n], entropy)``: the entropies ``[n]``
    (not differentiable) where ``with_entropy``, else an empty tensor."""

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, temperature: float,
                with_entropy: bool, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        logits = _head_logits(h, weight, bias, temperature, dtype)
        lse = torch.logsumexp(logits, -1)
        picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
        ctx.save_for_backward(h, weight, bias, targets, lse)
        ctx.temperature, ctx.dtype = temperature, dtype
        entropy = picked.new_zeros(0)
        if with_entropy:
            logp = logits.sub_(lse.unsqueeze(-1)).clamp_(min=torch.finfo(logits.dtype).min)  # 0 * -inf: nan
            entropy = -(logp.exp().mul_(logp)).sum(-1)
        ctx.mark_non_differentiable(entropy)
        return picked, entropy

    @staticmethod
    def backward(ctx, grad: Tensor, _entropy_grad: Tensor):
        h, weight, bias, targets, lse = ctx.saved_tensors
        g = (grad / ctx.temperature).unsqueeze(-1)
        # d picked / d logits = onehot(target) - softmax; times g, and 1/T for the logits' scale
        probs = _head_logits(h, weight, bias, ctx.temperature, ctx.dtype).sub_(lse.unsqueeze(-1)).exp_()
        grad_logits = probs.mul_(-g).scatter_add_(-1, targets.unsqueeze(-1), g).to(ctx.dtype)
        with torch.autocast(h.device.type, enabled=False):
            grad_h = grad_logits @ weight.to(ctx.dtype) if ctx.needs_input_grad[0] else None
            grad_w = grad_logits.t() @ h.to(ctx.dtype) if ctx.needs_input_grad[1] else None
        grad_b = grad_logits.sum(0) if bias is not None and ctx.needs_input_grad[2] else None
        return (None if grad_h is None else grad_h.to(h.dtype), None if grad_w is None else grad_w.to(weight.dtype),
                None if grad_b is None else grad_b.to(bias.dtype), None, None, None, None)


def _head_logits(h: Tensor, weight: Tensor, bias: Tensor | None, temperature: float, dtype: torch.dtype) -> Tensor:
    """``[n, V]`` float32 logits / temperature, the matmul in ``dtype`` outside autocast."""
    with torch.autocast(h.device.type, enabled=False):
        logits = F.linear(h.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype)).float()
    return logits.div_(temperature) if temperature != 1.0 else logits


def _matmul_dtype(h: Tensor, weight: Tensor) -> torch.dtype:
    """What ``F.linear(h, weight)`` computes in here: the autocast dtype where autocast is on."""
    kind = h.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else weight.dtype


def _chunk_logp(
    h: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, temperature: float
) -> Tensor:
    """``[n]`` log-probs of ``targets [n]``."""
    return _HeadLogProb.apply(h, weight, bias, targets, temperature, False, _matmul_dtype(h, weight))[0]


def _chunk_logp_entropy(
    h: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, temperature: float
) -> Tensor:
    """``[n, 2]``: log-probs of ``targets`` and entropies of the distributions (no gradient)."""
    return torch.stack(_HeadLogProb.apply(h, weight, bias, targets, temperature, True, _matmul_dtype(h, weight)), -1)


def _chunked(
    fn: Callable[..., Tensor],
    trailing: tuple[int, ...],
    hidden: Tensor,
    weight: Tensor,
    input_ids: Tensor,
    bias: Tensor | None,
    chunk_size: int,
    temperature: float,
    mask: Tensor | None,
    recompute: bool = False,
) -> Tensor:
    """Apply ``fn`` to the predicting positions in chunks.

    ``fn(h [n, H], weight, bias, targets [n], temperature)`` returns ``[n, *trailing]``; the
    result is ``[B, T, *trailing]`` float32 with zeros at ``t = 0`` and outside ``mask``.
    ``recompute``: run each chunk under ``torch.utils.checkpoint`` when a gradient is taken (for
    an ``fn`` whose autograd graph would keep ``[n, V]`` logits; `_HeadLogProb` keeps none).
    """
    if hidden.dim() != 3 or input_ids.shape != hidden.shape[:2] or hidden.shape[1] < 1:
        raise ValueError(
            f"hidden must be [B, T, H] and input_ids [B, T]; got {tuple(hidden.shape)} "
            f"and {tuple(input_ids.shape)}"
        )
    if chunk_size < 1 or temperature <= 0:
        raise ValueError(f"need chunk_size >= 1, temperature > 0; got {chunk_size}, {temperature}")
    B, T, H = hidden.shape
    h = hidden[:, :-1].reshape(-1, H)  # the state at t-1 predicts token t
    targets = input_ids[:, 1:].reshape(-1)
    keep = None
    if mask is not None:
        keep = mask[:, 1:].reshape(-1).bool().nonzero().squeeze(-1)
        h, targets = h.index_select(0, keep), targets.index_select(0, keep)
    needs_grad = [t.requires_grad for t in (hidden, weight, bias) if t is not None]
    use_ckpt = recompute and torch.is_grad_enabled() and any(needs_grad)
    pieces = [h.new_zeros((0, *trailing), dtype=torch.float32)]
    for start in range(0, h.shape[0], chunk_size):
        args = (h[start : start + chunk_size], weight, bias, targets[start : start + chunk_size])
        if use_ckpt:
            pieces.append(checkpoint(fn, *args, temperature, use_reentrant=False))
        else:
            pieces.append(fn(*args, temperature))
    flat = torch.cat(pieces)
    if keep is not None:
        flat = flat.new_zeros((B * (T - 1), *trailing)).index_copy(0, keep, flat)
    out = flat.reshape(B, T - 1, *trailing)
    return torch.cat([out.new_zeros((B, 1, *trailing)), out], dim=1)


def token_logprobs(
    hidden: Tensor,
    lm_head_weight: Tensor,
    input_ids: Tensor,
    lm_head_bias: Tensor | None = None,
    chunk_size: int = 1024,
    temperature: float = 1.0,
    mask: Tensor | None = None,
) -> Tensor:
    """Log-prob of each token given the tokens before it, without materializing all logits.

    ``out[:, t] = log_softmax((hidden[:, t-1] @ W.T + b) / temperature)[input_ids[:, t]]`` and
    ``out[:, 0] = 0`` (nothing predicts the first token). The ``B*(T-1)``
    predicting positions are processed ``chunk_size`` at a time: only ``[chunk_size, V]`` logits
    exist at once, in the forward and in the backward (recomputed, with the gradient of the
    log-softmax formed in place: `_HeadLogProb`), and none are saved for backward. The matmul
    runs in the weight's dtype (the autocast dtype under autocast) and the softmax in float32.
    Gradients flow to ``hidden`` and to the weight (and bias) where they require grad.

    Args:
        hidden: ``[B, T, H]`` last hidden states (after the final norm).
        lm_head_weight: ``[V, H]`` output embedding.
        input_ids: ``[B, T]`` token ids.
        lm_head_bias: ``[V]`` output bias, if the head has one.
        chunk_size: predicting positions per chunk.
        temperature: the sampler's temperature, so log-probs match the sampling distribution.
        mask: optional ``[B, T]`` bool; only positions where it is True are computed (the rest
            are 0), e.g. the action mask, which skips the prompt and observation tokens.

    Returns:
        ``[B, T]`` float32 log-probs.
    """
    return _chunked(
        _chunk_logp, (), hidden, lm_head_weight, input_ids, lm_head_bias, chunk_size, temperature,
        mask,
    )


def token_logprobs_and_entropy(
    hidden: Tensor,
    lm_head_weight: Tensor,
    input_ids: Tensor,
    lm_head_bias: Tensor | None = None,
    chunk_size: int = 1024,
    temperature: float = 1.0,
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``token_logprobs`` plus the entropy of each predicted distribution, in the same pass.

    Costs one extra ``[chunk_size, V]`` softmax per chunk. Arguments as ``token_logprobs``.

    Returns:
        ``(logp, entropy)``, both ``[B, T]`` float32; ``entropy[:, t]`` is the entropy of the
        distribution that predicted token ``t`` (0 at ``t = 0`` and outside ``mask``), detached
        (a health curve, not a loss term).
    """
    both = _chunked(
        _chunk_logp_entropy,
        (2,),
        hidden,
        lm_head_weight,
        input_ids,
        lm_head_bias,
        chunk_size,
        temperature,
        mask,
    )
    return both[..., 0], both[..., 1].detach()
