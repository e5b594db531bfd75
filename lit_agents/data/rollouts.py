"""Data modules: online rollouts each epoch (RL) and expert demonstrations (SFT).

Both share validation: greedy rollouts of the current policy on held-out ``test`` tasks, played
lazily while Lightning's validation loop iterates, yielding lists of `Rollout` that the
module's ``validation_step`` scores (``val/success``).

`RolloutDataModule.train_dataloader` runs when Lightning reloads it (every epoch, with
``reload_dataloaders_every_n_epochs=1``): it plays G attempts at each of this epoch's tasks with
the current policy (``self.trainer.lightning_module.policy``, eval mode, no grad), asks the module
to turn them into training rows (advantages + collate), and serves token-budgeted batches.
Under DDP every rank plays its own tasks, whole groups on one rank.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.strategies import FSDPStrategy
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader, IterableDataset

from lit_agents.agents.base import Agent
from lit_agents.agents.react import ReActAgent
from lit_agents.algorithms.collate import (
    Batch,
    Row,
    batches_by_tokens,
    collate_packed,
    collate_rows,
    group_steps,
    packs_by_tokens,
    record_advantages,
)
from lit_agents.data.demos import expert_episodes, read_episodes, write_episodes
from lit_agents.envs.base import Split, Task, TextEnv
from lit_agents.strategies import full_parameters
from lit_agents.types import Rollout

if TYPE_CHECKING:
    from lightning.pytorch import Trainer

    from lit_agents.policy import AgentPolicy

#: a batch a rank plays when it has fewer batches than another rank (DDP steps in lock-step)
PAD_STEP: list = []


class _Batches(IterableDataset):
    """A fixed list of batches (an IterableDataset so no sampler is injected), collated when
    iterated into `Batch` objects: a batch is a list of rows (padded) or a list of packs (lists of
    rows), ``[]`` an empty step, ``PAD_STEP`` a pad step. With gradient accumulation or under
    DDP each batch also carries its optimizer step's trained-token count (over all ranks)."""

    def __init__(
        self, batches: list[list], pad_id: int, step_tokens: list[int] | None = None, accumulate: int = 1,
        world: int = 1,
    ) -> None:
        self.batches, self.pad_id = batches, pad_id
        self.step_tokens, self.accumulate, self.world = step_tokens, accumulate, world

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Batch]:
        for i, items in enumerate(self.batches):
            if items is PAD_STEP:
                yield Batch.pad()  # this rank has no rows left; the other ranks still step
            elif not items:
                yield Batch.empty()  # nothing to learn this step, on any rank
            else:
                collate = collate_packed if isinstance(items[0], list) else collate_rows
                tokens = None if self.step_tokens is None else self.step_tokens[i]
                yield Batch(collate(items, self.pad_id, with_meta=True), step_tokens=tokens, accumulate=self.accumulate,
                            world=self.world)


def _trained_tokens(items: list) -> int:
    rows = [row for item in items for row in (item if isinstance(item, list) else [item])]
    return sum(row.num_trained for row in rows)


class _LazyRollouts(IterableDataset):
    """Plays the tasks chunk by chunk when iterated; yields each chunk's rollouts."""

    def __init__(self, datamodule: AgentDataModule, tasks: list[Task], chunk: int) -> None:
        self.dm, self.tasks, self.chunk = datamodule, tasks, chunk

    def __len__(self) -> int:
        return -(-len(self.tasks) // self.chunk)

    def __iter__(self) -> Iterator[list[Rollout]]:
        for start in range(0, len(self.tasks), self.chunk):
            rollouts = self.dm.play(self.tasks[start : start + self.chunk], 1, greedy=self.dm.val_greedy, seed=start)
            self.dm._write(rollouts, "val")
            yield rollouts


def run_seed() -> int:
    """The run's ``seed_everything`` (Lightning records it in ``PL_GLOBAL_SEED``); 0 when unseeded."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


class AgentDataModule(LightningDataModule):
    """Environment, agent loop and held-out validation shared by the data modules.

    Args:
        env: the environment (``class_path`` in YAML).
        agent: the agent loop; defaults to `ReActAgent()`.
        val_tasks: held-out tasks scored each validation (a fixed, seeded sample of
            ``val_split``); ``None`` = all of them.
        val_split: ``test`` (held-out tasks, e.g. unseen goal items) or ``val`` (held-out
            instances of train tasks).
        val_greedy: greedy decoding for validation (else the agent's sampling settings).
        val_chunk: tasks played per validation batch.
        seed: seed for task sampling and rollouts; ``None`` (the default) = the run's
            ``seed_everything`` (Lightning's ``PL_GLOBAL_SEED``; 0 when nothing seeded the run),
            so ``--seed_everything=S`` alone gives a run its own tasks and sampling seeds.
        save_rollouts: also write every rollout played to ``<log_dir>/rollouts/*.jsonl``
            (``{train,val}-epochNNNN-rankR.jsonl``; trained sessions with their ``advantage``);
            ``lit-agents view`` shows them (docs/viewer.md).
    """

    packing = False  # training data modules set these (`token_batches`)
    _accumulate = 1  # the micro-batches per optimizer step this module last set on the trainer
    pack_length: int | None = None
    max_tokens_per_batch = 8192

    def __init__(
        self,
        env: TextEnv,
        agent: Agent | None = None,
        val_tasks: int | None = 64,
        val_greedy: bool = True,
        val_chunk: int = 64,
        seed: int | None = None,
        save_rollouts: bool = False,
        val_split: Split = "test",
    ) -> None:
        super().__init__()
        self.val_split = val_split
        self.env = env
        self.agent = agent or ReActAgent()
        self.val_tasks = val_tasks
        self.val_greedy = val_greedy
        self.val_chunk = val_chunk
        self.seed = run_seed() if seed is None else seed
        self.save_rollouts = save_rollouts
        #: the last epoch's training rollouts and the seconds they took to play (online RL)
        self.last_rollouts: list[Rollout] = []
        self.last_rollout_seconds = 0.0
        self._written: set[Path] = set()  # rollout files this process has written to

    def setup(self, stage: str) -> None:
        """Connect to the module this data feeds (`AgentModule.connect_data`)."""
        self.trainer.lightning_module.connect_data(self)

    # ------------------------------------------------------------------ helpers
    @property
    def world(self) -> tuple[int, int]:
        """(rank, world size); (0, 1) outside a trainer."""
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def rank_share(self, tasks: list[Task]) -> list[Task]:
        rank, world = self.world
        return tasks[rank::world]

    def held_out_tasks(self, split: Split | None = None) -> list[Task]:
        tasks = list(self.env.tasks(split or self.val_split))
        random.Random(self.seed).shuffle(tasks)
        return tasks if self.val_tasks is None else tasks[: self.val_tasks]

    def play(self, tasks: list[Task], group_size: int, *, greedy: bool, seed: int, group_offset: int = 0,
             policy: AgentPolicy | None = None, trainer: Trainer | None = None) -> list[Rollout]:
        """Roll out a policy (eval mode, no grad) on ``tasks``, seeded from this module's ``seed``
        offset by ``seed``: by default the training module's policy under this module's trainer;
        ``lit-agents eval`` passes its own policy and a trainer that is not fitting."""
        trainer = self.trainer if trainer is None else trainer
        module = trainer.lightning_module
        policy = module.policy if policy is None else policy
        was_training = policy.training
        policy.eval()
        try:
            # rollouts run under the trainer's precision (bf16-mixed: autocast), as training does,
            # with whole parameters where the strategy shards them, and a LoRA adapter folded into
            # the weights where that is exact (`AgentPolicy.merged_adapter`; never on sharded ones)
            sharded = isinstance(trainer.strategy, FSDPStrategy)
            with torch.no_grad(), trainer.precision_plugin.forward_context(), full_parameters(trainer), \
                    (contextlib.nullcontext() if sharded else policy.merged_adapter()):
                rollouts = self.agent.run(
                    policy, self.env, tasks, group_size, greedy=greedy,
                    seed=self.seed * 1_000_003 + seed, group_offset=group_offset,
                    policy_version=module.global_step if module is not None else 0,
                )
        finally:
            policy.train(was_training)
        return rollouts

    def play_chunks(self, tasks: list[Task], group_size: int, chunk: int, *, seed: int, seed_step: int,
                    group_offset: int = 0, policy: AgentPolicy | None = None,
                    trainer: Trainer | None = None) -> list[Rollout]:
        """Sampled rollouts of ``tasks`` (`play`), ``chunk`` tasks per call so that only a chunk's
        episodes hold their KV caches at once; chunk k is seeded ``seed + k * seed_step``."""
        rollouts: list[Rollout] = []
        for k, start in enumerate(range(0, len(tasks), chunk)):
            rollouts += self.play(tasks[start : start + chunk], group_size, greedy=False, seed=seed + k * seed_step,
                                  group_offset=group_offset + start, policy=policy, trainer=trainer)
        return rollouts

    def _write(self, rollouts: list[Rollout], split: str) -> None:
        if not self.save_rollouts or self.trainer is None or self.trainer.log_dir is None:
            return
        folder = Path(self.trainer.log_dir) / "rollouts"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{split}-epoch{self.trainer.current_epoch:04d}-rank{self.world[0]}.jsonl"
        # an epoch's first write in this process replaces what a killed run left there (a resume
        # plays that epoch again); its later chunks (validation) append
        with path.open("a" if path in self._written else "w") as f:
            self._written.add(path)
            for rollout in rollouts:
                f.write(json.dumps(rollout.to_dict()) + "\n")

    def val_dataloader(self) -> DataLoader:
        tasks = self.rank_share(self.held_out_tasks())
        return DataLoader(_LazyRollouts(self, tasks, self.val_chunk), batch_size=None, collate_fn=_identity)

    def token_batches(self, rows: list[Row]) -> list[list]:
        """Training batches of ``max_tokens_per_batch`` tokens: rows of similar length padded
        together, or a task's rows together where the policy runs their shared prompt once and
        that costs fewer positions (`collate.batches_by_tokens`); with ``packing`` rows put end
        to end (`collate.packs_by_tokens`). For a module that optimizes by hand, whose every
        micro-batch is an optimizer step, the rows stay in the order given (shuffled by the
        caller), so that no step is a slice of the data of one length."""
        if not self.packing:
            module = self.trainer.lightning_module if self.trainer is not None else None
            policy = module.policy if module is not None else None
            return batches_by_tokens(rows, self.max_tokens_per_batch,
                                     share_prefix=policy is not None and policy.shares_prefixes(),
                                     by_length=getattr(module, "automatic_optimization", True))
        return packs_by_tokens(rows, self.max_tokens_per_batch, self.pack_length)

    def _loader(self, steps: list[list[list]], k: int | None = None) -> DataLoader:
        """Serve optimizer steps, each a list of micro-batches (lists of rows or packs).

        Every step is padded to the same number of micro-batches ``k`` with pad batches (`Batch.pad`)
        (a zero-gradient step in the modules), and the trainer accumulates gradients over ``k``
        batches, so each step is one optimizer step; every batch carries its step's trained-token
        count, so the modules normalize the loss by the step's tokens (one token mean over the
        whole step, not a mean of per-batch means). Under DDP every rank serves the same number
        of steps of the same ``k`` (the most any rank has; steps in lock-step keep the gradient
        all-reduces matched). No rank with rows: one empty batch each. A module that optimizes
        by hand (``automatic_optimization = False``) steps on every batch: its micro-batches are
        its steps. ``k`` fixes the micro-batches a step (the configured accumulation, for SFT);
        ``None`` = the most any step has."""
        module = self.trainer.lightning_module
        if not module.automatic_optimization:
            steps, k = [[batch] for step in steps for batch in step], 1
        steps = [step for step in ([b for b in step if b] for step in steps) if step]
        count, k = len(steps), k or max(map(len, steps), default=1)
        if self.world[1] > 1:
            both = torch.tensor([count, k], device=self.trainer.strategy.root_device)
            count, k = (int(v) for v in self.trainer.strategy.reduce(both, reduce_op="max"))
        if count == 0:
            return DataLoader(_Batches([[]], module.policy.pad_id), batch_size=None)  # an empty loader stops fitting
        steps += [[]] * (count - len(steps))
        batches: list[list] = []
        for step in steps:
            batches += step + [PAD_STEP] * (k - len(step))
        tokens = self._step_tokens(steps)
        if module.automatic_optimization:
            self.trainer.accumulate_grad_batches = self._accumulate = k
        world = self.world[1]
        step_tokens = [t for t in tokens for _ in range(k)] if k > 1 or world > 1 else None
        return DataLoader(_Batches(batches, module.policy.pad_id, step_tokens, k, world), batch_size=None)

    def _step_tokens(self, steps: list[list]) -> list[int]:
        """Each optimizer step's trained tokens, summed over the ranks under DDP: DDP averages the
        ranks' gradients, so each rank divides its summed token losses by ``total / world`` and a
        step is one token mean over every rank's tokens (not a mean of the ranks' token means)."""
        tokens = [sum(_trained_tokens(b) for b in step) for step in steps]
        if self.world[1] > 1 and tokens:
            summed = self.trainer.strategy.reduce(torch.tensor(tokens, device=self.trainer.strategy.root_device),
                                                  reduce_op="sum")
            tokens = [int(t) for t in summed.tolist()]
        return tokens

def _identity(x):
    return x


class RolloutDataModule(AgentDataModule):
    """Online rollouts each epoch: G attempts at each of ``tasks_per_epoch`` train tasks.

    Args:
        tasks_per_epoch: tasks per epoch on each rank (whole groups stay on one rank).
        group_size: attempts per task (G).
        mini_batches: optimizer steps per pass over the epoch's rows. Each step holds whole
            groups (every rollout of each task it contains, with all their sessions or nodes:
            `collate.group_steps`), groups shuffled and split into steps of about equal tokens.
        max_tokens_per_batch: token budget of one micro-batch: a step's rows, sorted by length,
            go into micro-batches under this budget, and gradient accumulation joins them into
            one optimizer step whose loss is the token mean over the whole step. The data module
            sets ``trainer.accumulate_grad_batches`` itself each epoch (leave it at 1).
        update_epochs: passes over the epoch's rows (PPO epochs); the first is on-policy, and
            each pass regroups the steps.
        split: task split to train on.
        rollout_chunk: tasks played at once in an epoch's rollout (with their G attempts each);
            ``None`` = all of the epoch's tasks in one call. Every live episode holds its KV
            cache, so this bounds the rollout's memory (on a CPU the SmolLM2 quick start's
            16 x 8 episodes take 9.8 GB above the model in one call, 4.7 GB in chunks of 8:
            docs/performance.md). Each chunk samples from its own seed: the same distribution,
            other draws than one call.
        packing: put rows end to end in packs instead of padding them (`collate.packs_by_tokens`):
            no compute on padding, attention kept within each row. Fastest with flash attention
            (varlen); with sdpa/eager attention spans whole packs, and on CPU length-sorted padding
            (the default) is faster (docs/results.md).
        pack_length: tokens per pack; ``None`` = the longest row of the epoch.
        **kwargs: see `AgentDataModule`.
    """

    def __init__(
        self,
        env: TextEnv,
        agent: Agent | None = None,
        tasks_per_epoch: int = 16,
        group_size: int = 8,
        mini_batches: int = 1,
        max_tokens_per_batch: int = 16384,
        update_epochs: int = 1,
        split: Split = "train",
        rollout_chunk: int | None = None,
        val_tasks: int | None = 64,
        val_greedy: bool = True,
        val_chunk: int = 64,
        seed: int | None = None,
        save_rollouts: bool = False,
        val_split: Split = "test",
        packing: bool = False,
        pack_length: int | None = None,
    ) -> None:
        super().__init__(env, agent, val_tasks, val_greedy, val_chunk, seed, save_rollouts, val_split)
        self.packing, self.pack_length = packing, pack_length
        self.tasks_per_epoch = tasks_per_epoch
        if group_size < 1 or tasks_per_epoch < 1:
            raise ValueError(f"group_size and tasks_per_epoch must be at least 1 (attempts per task, tasks per "
                             f"epoch), got {group_size}, {tasks_per_epoch}")
        self.group_size = group_size
        if mini_batches < 1 or update_epochs < 1:
            raise ValueError(f"mini_batches and update_epochs must be at least 1, got {mini_batches}, {update_epochs}")
        self.mini_batches = mini_batches
        self.max_tokens_per_batch = max_tokens_per_batch
        self.update_epochs = update_epochs
        self.split = split
        if rollout_chunk is not None and rollout_chunk < 1:
            raise ValueError(f"rollout_chunk must be at least 1 task (or None for all), got {rollout_chunk}")
        self.rollout_chunk = rollout_chunk

    def epoch_tasks(self, epoch: int) -> list[Task]:
        """This rank's tasks for ``epoch``: a seeded pass through the shuffled train split."""
        tasks = list(self.env.tasks(self.split))
        rank, world = self.world
        need = self.tasks_per_epoch * world
        passes: dict[int, list[Task]] = {}
        picked = []
        for i in range(epoch * need, (epoch + 1) * need):
            cycle, index = divmod(i, len(tasks))
            if cycle not in passes:
                passes[cycle] = list(tasks)
                random.Random(self.seed * 7919 + cycle).shuffle(passes[cycle])
            picked.append(passes[cycle][index])
        return picked[rank::world]

    def setup(self, stage: str) -> None:
        super().setup(stage)
        accumulate = self.trainer.accumulate_grad_batches
        if stage == "fit" and accumulate not in (1, self._accumulate):
            raise ValueError(
                f"RolloutDataModule builds each optimizer step from whole groups and sets the gradient accumulation "
                f"itself; trainer.accumulate_grad_batches={accumulate} would split its steps. Leave it at 1 and set "
                f"data.mini_batches (optimizer steps per pass) and data.max_tokens_per_batch (micro-batch size)")

    def play_epoch(self, epoch: int, policy: AgentPolicy | None = None,
                   trainer: Trainer | None = None) -> list[Rollout]:
        """This rank's sampled rollouts of ``epoch``: G attempts at each of its tasks,
        ``rollout_chunk`` tasks at a time (see `play` for ``policy`` and ``trainer``)."""
        tasks = self.epoch_tasks(epoch)
        offset = self.world[0] * self.tasks_per_epoch
        chunk = self.rollout_chunk or max(len(tasks), 1)
        # chunk 0 keeps the seed of one call for the whole epoch
        return self.play_chunks(tasks, self.group_size, chunk, seed=epoch, seed_step=1 << 24, group_offset=offset,
                                policy=policy, trainer=trainer)

    def train_dataloader(self) -> DataLoader:
        module = self.trainer.lightning_module
        progress = self.trainer.fit_loop.epoch_progress.current
        if progress.processed > progress.completed:
            # resuming from a checkpoint written at an epoch's end: Lightning asks for a loader
            # under the finished epoch's number, then again for the next epoch; playing the
            # first would redo a whole epoch of rollouts only to throw them away
            return DataLoader(_Batches([[]], module.policy.pad_id), batch_size=None)
        epoch = self.trainer.current_epoch
        started = time.perf_counter()
        rollouts = self.play_epoch(epoch)
        self.last_rollouts, self.last_rollout_seconds = rollouts, time.perf_counter() - started
        rows = module.training_rows(rollouts)
        if not rows:
            solved = sum(r.success for r in rollouts)
            rank_zero_info(f"epoch {epoch}: no learning signal in {len(rollouts)} rollouts ({solved} succeeded): "
                           "every group scored alike, so there is nothing to train on")
        record_advantages(rollouts, rows)  # the saved rollouts show what each session was trained with
        self._write(rollouts, "train")
        rng = random.Random(self.seed * 31 + epoch)
        steps = [self.token_batches(step) for _ in range(self.update_epochs)
                 for step in group_steps(rows, self.mini_batches, rng)]
        # an epoch without learning signal (every group solved or every group failed) yields one
        # empty batch (`_loader`)
        return self._loader(steps)


def _settings_file(demonstrations: Path) -> Path:
    """Where the settings that generated ``demonstrations`` are kept: ``x.jsonl`` -> ``x.settings.json``."""
    return demonstrations.with_suffix(".settings.json")


def _spread(i: int, fraction: float, phase: float = 0.0) -> bool:
    """Whether item ``i`` is among a ``fraction`` of the items, spread evenly over the indices."""
    return fraction > 0 and (i * fraction + phase) % 1.0 + fraction >= 1.0


class DemonstrationDataModule(AgentDataModule):
    """Expert demonstrations on train tasks, tokenized exactly like the policy's own turns.

    Args:
        env: the environment (``class_path`` in YAML).
        agent: the agent loop that replays the demonstrations; defaults to `ReActAgent()`.
        demos: number of expert episodes (cycling through the shuffled train tasks);
            ``None`` = one per train task.
        max_tokens_per_batch: token budget of one batch (see `RolloutDataModule`).
        path: a JSONL file of text episodes (`lit_agents.data.demos`, as ``lit-agents demos``
            writes). Bring your own demonstrations here. A missing file is an error unless
            ``generate``; an empty one always is. ``None``: the expert's, generated each fit.
        generate: with ``path``, generate the expert's demonstrations and write them there when
            the file does not exist (one line says where), with the settings that decide them
            beside it (``x.settings.json``): a later fit asking for others (``noisy``, ``demos``,
            ``seed``, the env's tasks, ...) is refused instead of training on these.
        check_env: refuse demonstrations recorded in another env than ``env`` (each line's
            ``env``, which ``lit-agents demos`` writes); ``False`` trains on them anyway.
        val_tasks, val_greedy, val_chunk, seed, val_split: see `AgentDataModule`.
        noisy: fraction of the demonstrations played by an epsilon-noisy expert (agents with an
            ``expert_episode(env, task, epsilon, seed)``, e.g. `HierarchicalAgent`): offline RL
            data with something to choose between. Their failures are kept.
        epsilon: the noisy expert's chance of a random action per step.
        packing, pack_length: see `RolloutDataModule`.
        renamed: fraction of the demonstrations replayed in a world whose entity names the env
            shuffles (`TextEnv.rename`): the policy must then read a task's names off the prompt
            instead of memorising each train task, which is what carries it to unseen tasks.
        behavior_episodes: episodes the policy being trained plays itself before training
            (sampled at the agent's temperature, on train tasks in another shuffled order), added
            to the demonstrations with their failures: the behavior policy's data an offline
            actor-critic from an SFT start learns which of its own actions to keep from. Played
            at the first epoch of each fit (on the model's device; a resumed fit plays the resumed
            policy), ``behavior_chunk`` tasks at a time; how many succeeded is logged.
        behavior_chunk: tasks per rollout call when playing ``behavior_episodes``.
    """

    def __init__(
        self,
        env: TextEnv,
        agent: Agent | None = None,
        demos: int | None = None,
        max_tokens_per_batch: int = 8192,
        path: str | None = None,
        val_tasks: int | None = 64,
        val_greedy: bool = True,
        val_chunk: int = 64,
        seed: int | None = None,
        val_split: Split = "test",
        noisy: float = 0.0,
        epsilon: float = 0.3,
        packing: bool = False,
        pack_length: int | None = None,
        renamed: float = 0.0,
        behavior_episodes: int = 0,
        behavior_chunk: int = 64,
        generate: bool = False,
        check_env: bool = True,
    ) -> None:
        super().__init__(env, agent, val_tasks, val_greedy, val_chunk, seed, val_split=val_split)
        if path is not None and not generate and not Path(path).exists():
            raise FileNotFoundError(f"demonstrations {path} do not exist: fix data.init_args.path, or set "
                                    "data.init_args.generate: true to write the expert's there")
        self.generate, self.check_env = generate, check_env
        if behavior_episodes < 0 or behavior_chunk < 1:
            raise ValueError(f"behavior_episodes must be >= 0 and behavior_chunk >= 1, got {behavior_episodes}, "
                             f"{behavior_chunk}")
        self.behavior_episodes, self.behavior_chunk = behavior_episodes, behavior_chunk
        self._behavior_pending = False
        if not 0.0 <= renamed <= 1.0:
            raise ValueError(f"renamed must be in [0, 1], got {renamed}")
        if renamed and type(env).rename is TextEnv.rename:
            raise ValueError(
                f"renamed demonstrations need an env that can rename entities; {type(env).__name__} cannot"
            )
        self.renamed = renamed
        self.packing, self.pack_length = packing, pack_length
        if not 0.0 <= noisy <= 1.0 or not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"noisy and epsilon must be in [0, 1], got {noisy}, {epsilon}")
        if noisy and not hasattr(self.agent, "expert_episode"):
            raise ValueError(f"noisy demonstrations need an agent with expert_episode, not {type(self.agent).__name__}")
        self.noisy, self.epsilon = noisy, epsilon
        self.demos = demos
        self.max_tokens_per_batch = max_tokens_per_batch
        self.path = path
        self.rows: list[Row] = []

    def demo_tasks(self) -> list[Task]:
        tasks = list(self.env.tasks("train"))
        random.Random(self.seed).shuffle(tasks)
        count = len(tasks) if self.demos is None else self.demos
        return [tasks[i % len(tasks)] for i in range(count)]

    def demonstrations(self) -> list[Rollout]:
        """Expert rollouts tokenized for the policy, from ``path`` when it exists."""
        if self.path and (Path(self.path).exists() or not self.generate):
            if self.generate:
                self._check_generated_alike(Path(self.path))
            episodes = self._read_demonstrations(Path(self.path))
        else:
            episodes = self._expert_episodes(self.demo_tasks())
            failed = [e.task.task_id for i, e in enumerate(episodes) if not e.success and not self._is_noisy(i)]
            if failed:
                raise RuntimeError(f"the expert failed {len(failed)} demonstrations, e.g. {failed[:3]}")
            episodes = [self.env.rename(e, self.seed) if _spread(i, self.renamed, 0.5) else e
                        for i, e in enumerate(episodes)]
            if self.path and self.world[0] == 0:  # one writer under DDP
                write_episodes(episodes, self.path)
                settings, tmp = _settings_file(Path(self.path)), Path(f"{self.path}.settings.tmp")
                tmp.write_text(json.dumps(self.generation_settings(), indent=1))
                tmp.replace(settings)  # whole or absent, as write_episodes leaves the data
                rank_zero_info(f"wrote {len(episodes)} expert demonstrations to {self.path}")
        policy = self.trainer.lightning_module.policy
        rollouts = [self.agent.replay(policy, self.env, e, i) for i, e in enumerate(episodes)]
        # agents that play a demonstration again (multi-session, recursive) can fail where the
        # recorded expert succeeded: such rollouts are not demonstrations
        lost = {i for i, (e, r) in enumerate(zip(episodes, rollouts)) if e.success and not r.success}
        if lost:
            rank_zero_warn(f"{len(lost)} of {len(rollouts)} demonstrations failed when {type(self.agent).__name__} "
                           f"played them again (e.g. {rollouts[min(lost)].task_id}); they are left out")
        return [r for i, r in enumerate(rollouts) if i not in lost]

    def generation_settings(self) -> dict[str, Any]:
        """What decides the expert's demonstrations this module generates: written beside them,
        so that a later fit asking for others does not read these silently."""
        tasks = hashlib.sha256("\n".join(t.task_id for t in self.demo_tasks()).encode()).hexdigest()[:16]
        return {"env": f"{type(self.env).__module__}.{type(self.env).__qualname__}", "agent": type(self.agent).__name__,
                "tasks": tasks, "demos": self.demos, "seed": self.seed, "noisy": self.noisy,
                "epsilon": self.epsilon, "renamed": self.renamed}

    def _check_generated_alike(self, path: Path) -> None:
        """Refuse generated demonstrations at ``path`` whose settings differ from this fit's (files
        without settings beside them, e.g. a user's own, are read as they are)."""
        saved = _settings_file(path)
        if not saved.exists():
            return
        before, now = json.loads(saved.read_text()), self.generation_settings()
        differ = [f"{k}={before.get(k)!r} -> {now[k]!r}" for k in now if before.get(k) != now[k]]
        if differ:
            raise ValueError(f"demonstrations {path} were generated with other settings than this fit asks for "
                             f"({', '.join(differ)}): delete {path} to generate them again, or set another "
                             "data.init_args.path")

    def _read_demonstrations(self, path: Path) -> list:
        """The episodes of ``path``, refused where they cannot be this fit's demonstrations."""
        episodes = read_episodes(path)
        if not episodes:
            raise ValueError(f"demonstrations {path} hold no episodes")
        mine = f"{type(self.env).__module__}.{type(self.env).__qualname__}"
        other = next((e.env for e in episodes if e.env and e.env != mine), None)
        if self.check_env and other is not None:
            raise ValueError(f"demonstrations {path} were recorded in {other}, but this config's env is {mine}: "
                             "use demonstrations of this env, or set data.init_args.check_env: false")
        return episodes

    def _is_noisy(self, i: int) -> bool:
        return _spread(i, self.noisy)

    def _expert_episodes(self, tasks: list[Task]) -> list:
        play = getattr(self.agent, "expert_episode", None)
        if play is None:
            return list(expert_episodes(self.env, tasks))
        return [play(self.env, t, self.epsilon if self._is_noisy(i) else 0.0, seed=self.seed + i)
                for i, t in enumerate(tasks)]

    def behavior_rollouts(self) -> list[Rollout]:
        """This rank's share of ``behavior_episodes``: the policy's own sampled episodes on
        train tasks (cycling through another shuffled order than the demonstrations')."""
        if not self.behavior_episodes:
            return []
        tasks = list(self.env.tasks("train"))
        random.Random(f"behavior/{self.seed}").shuffle(tasks)
        tasks = self.rank_share([tasks[i % len(tasks)] for i in range(self.behavior_episodes)])
        rollouts = self.play_chunks(tasks, 1, self.behavior_chunk, seed=-1, seed_step=-1,  # apart from epochs' seeds
                                    group_offset=self.world[0] * self.behavior_episodes)
        rank_zero_info(f"behavior data: {len(rollouts)} episodes of the starting policy, "
                       f"{sum(r.success for r in rollouts)} succeeded")
        return rollouts

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if stage == "fit" and not self.rows:
            rollouts = self.rank_share(self.demonstrations())
            self.rows = self.trainer.lightning_module.demonstration_rows(rollouts)
            self._behavior_pending = bool(self.behavior_episodes)  # played on the model's device

    def train_dataloader(self) -> DataLoader:
        if self._behavior_pending:  # before the first step: the starting policy
            self._behavior_pending = False
            self.rows += self.trainer.lightning_module.demonstration_rows(self.behavior_rollouts())
        rows = list(self.rows)
        random.Random(self.seed * 31 + self.trainer.current_epoch).shuffle(rows)
        batches = self.token_batches(rows)
        random.Random(self.seed * 17 + self.trainer.current_epoch).shuffle(batches)
        k = self.trainer.accumulate_grad_batches  # demonstrations: the configured accumulation
        return self._loader([batches[i : i + k] for i in range(0, len(batches), k)], k)
