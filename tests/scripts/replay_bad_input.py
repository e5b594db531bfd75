"""Replays, as a new user would type them, the ways bad input can lose work or hide its cause, and
prints one line per case: PASS where the library gives a clear error and loses nothing.

Usage: python tests/scripts/replay_bad_input.py [--keep DIR] [--only 1a,5f]   (7-8 minutes on 2 CPU cores)

Every case runs `lit-agents` in a subprocess on the debug overlays (toy model, seconds a fit)
in a fresh folder, and checks what a user sees (exit status, the error's first lines) and what
is left on disk. The unit tests of each case are in tests/test_bad_input.py and beside the code
they cover (test_demos, test_eval, test_viewer, test_models, test_quickstart, test_scale).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).parents[2]
CONFIGS, DEBUG = ROOT / "configs", ROOT / "configs" / "debug"
TINY = ["--model.init_args.policy.init_args.model=tiny", "-c", str(DEBUG / "tiny_model.yaml")]
RL = ["-c", str(CONFIGS / "quickstart_rl.yaml"), "-c", str(DEBUG / "short.yaml"),
      "-c", str(DEBUG / "short_rollouts.yaml"), *TINY]
SFT = ["-c", str(CONFIGS / "quickstart.yaml"), "-c", str(DEBUG / "short.yaml"), "-c", str(DEBUG / "short_demos.yaml"),
       "-c", str(DEBUG / "tiny_model.yaml")]
UPDATES = ["-c", str(DEBUG / "always_update.yaml")]


class Case:
    """One case: a folder to work in and `lit-agents` to run there."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def run(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        base = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "LIT_AGENTS_CACHE": str(CACHE)}
        base.pop("LIT_AGENTS_DEBUG", None)
        return subprocess.run([sys.executable, "-m", "lit_agents.cli", *args], cwd=self.folder, text=True,
                              capture_output=True, env={**base, **(env or {})}, timeout=600)

    def fit(self, kind: list[str], *args: str, save: str = "runs",
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return self.run("fit", *kind, f"--trainer.default_root_dir={save}",
                        f"--trainer.logger.init_args.save_dir={save}", *args, env=env)


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def error(done: subprocess.CompletedProcess) -> str:
    """The short error a command printed (its ``error:`` line), or the end of its output."""
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    return lines[-1] if lines else done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""


def short(done: subprocess.CompletedProcess, needle: str) -> tuple[bool, str]:
    """Failed with ``needle`` in a short message (at most 3 lines from ``error:`` on), no traceback."""
    after = done.stderr[done.stderr.find("error:"):] if "error:" in done.stderr else done.stderr
    ok = done.returncode != 0 and needle in after and "Traceback" not in done.stderr and len(after.splitlines()) <= 3
    return ok, error(done)[:150]


# ----------------------------------------------------------------------------- 1. the run's record
def failed_resume(case: Case) -> tuple[bool, str]:
    case.fit(RL, *UPDATES, "--trainer.max_epochs=1")
    run = case.folder / "runs" / "quickstart_rl" / "version_0"
    before = files(run)
    done = case.fit(RL, *UPDATES, "--trainer.max_epochs=2", "--ckpt_path", "last",
                    "--model.init_args.policy.init_args.lora_r=16")
    kept = files(run) == before
    again = case.run("fit", "-c", str(run / "config.yaml"), "--trainer.max_epochs=2", "--ckpt_path",
                     str(run / "checkpoints" / "last.ckpt"))
    ok = done.returncode != 0 and kept and again.returncode == 0 and (run / "config-resume-1.yaml").exists()
    return ok, f"run folder unchanged: {kept}; its recipe resumes it: {again.returncode == 0}; {error(done)[:90]}"


def corrupt_last(case: Case) -> tuple[bool, str]:
    case.fit(RL, *UPDATES, "--trainer.max_epochs=2")
    run = case.folder / "runs" / "quickstart_rl" / "version_0"
    last = run / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[:3000])
    before = files(run)
    done = case.fit(RL, *UPDATES, "--trainer.max_epochs=3", "--ckpt_path", "last")
    named = re.search(r"readable checkpoints beside it, newest first: (\S+)", done.stderr)
    return bool(named) and files(run) == before, f"config.yaml kept; names {named.group(1) if named else None}"


# ----------------------------------------------------------------------------- 2. demonstrations
def demos_file(case: Case, name: str = "demos.jsonl") -> Path:
    case.run("demos", "-c", str(CONFIGS / "quickstart.yaml"), "--limit", "4", "--out", name)
    return case.folder / name


def mistyped_demos(case: Case) -> tuple[bool, str]:
    done = case.fit(SFT, "--data.init_args.path=demoss.jsonl")
    ok, message = short(done, "do not exist")
    made = case.fit(SFT, "--data.init_args.path=new.jsonl", "--data.init_args.generate=true")
    said = "wrote 4 expert demonstrations to new.jsonl" in made.stdout + made.stderr
    return ok and not (case.folder / "demoss.jsonl").exists() and said, f"{message}; generate=true says where: {said}"


def empty_demos(case: Case) -> tuple[bool, str]:
    (case.folder / "empty.jsonl").write_text("\n")
    done = case.fit(SFT, "--data.init_args.path=empty.jsonl")
    ok, message = short(done, "hold no episodes")
    return ok and not list(case.folder.glob("runs/*/*/adapters")), message


def other_env_demos(case: Case) -> tuple[bool, str]:
    case.run("demos", "--env", "lit_agents.envs.TextCraftSynth", "--limit", "2", "--out", "synth.jsonl")
    return short(case.fit(SFT, "--data.init_args.path=synth.jsonl"), "were recorded in")


def null_action(case: Case) -> tuple[bool, str]:
    path = demos_file(case)
    lines = path.read_text().splitlines()
    bad = json.loads(lines[1])
    bad["steps"][0]["action"] = None
    path.write_text("\n".join([lines[0], json.dumps(bad), *lines[2:]]) + "\n")
    return short(case.fit(SFT, f"--data.init_args.path={path.name}"), "demos.jsonl:2: step 0: 'action' must be a str")


# ----------------------------------------------------------------------------- 3. result folders
def eval_twice(case: Case) -> tuple[bool, str]:
    case.fit(RL, *UPDATES, "--trainer.max_epochs=1")
    adapters = case.folder / "runs" / "quickstart_rl" / "version_0" / "adapters" / "last"
    args = ["eval", "-c", str(CONFIGS / "quickstart_rl.yaml"), *TINY, "--tasks", "2", "--adapter", str(adapters)]
    case.run(*args)
    first = (adapters.parents[1] / "eval" / "last-test" / "results.csv").read_bytes()
    second = case.run(*args)
    kept = (adapters.parents[1] / "eval" / "last-test" / "results.csv").read_bytes() == first
    versioned = (adapters.parents[1] / "eval" / "last-test-v1" / "results.csv").exists()
    refused = case.run(*args, "--out", str(adapters.parents[1] / "eval" / "last-test"))
    ok = second.returncode == 0 and kept and versioned and refused.returncode != 0
    return ok, f"second eval in last-test-v1: {versioned}; --out onto results: {error(refused)[:70]}"


def pinned_version(case: Case) -> tuple[bool, str]:
    case.fit(RL, *UPDATES, "--trainer.max_epochs=1", "--trainer.logger.init_args.version=0")
    before = files(case.folder / "runs")
    done = case.fit(RL, *UPDATES, "--trainer.max_epochs=1", "--trainer.logger.init_args.version=0")
    ok, message = short(done, "holds an earlier run")
    return ok and files(case.folder / "runs") == before, message


def second_quickstart(case: Case) -> tuple[bool, str]:
    (case.folder / "qs" / "sft_model").mkdir(parents=True)
    (case.folder / "qs" / "sft_model" / "config.json").write_text("{}")
    return short(case.run("quickstart", "--out", "qs", "--config-dir", str(CONFIGS)), "holds an earlier quick start")


def demos_overwrite(case: Case) -> tuple[bool, str]:
    (case.folder / "mine.jsonl").write_text("my episodes\n")
    done = case.run("demos", "-c", str(CONFIGS / "quickstart.yaml"), "--limit", "2", "--out", "mine.jsonl")
    kept = (case.folder / "mine.jsonl").read_text() == "my episodes\n"
    return done.returncode != 0 and kept, error(done)[:150]


# ----------------------------------------------------------------------------- 4. silent no-ops
def debug_overlay(case: Case) -> tuple[bool, str]:
    from safetensors.torch import load_file

    plain = case.fit(RL, save="plain")
    updates = case.fit(RL, *UPDATES, save="updates")
    weights = [load_file(next(case.folder.glob(f"{save}/*/*/adapters/last/default/adapter_model.safetensors")))
               for save in ("plain", "updates")]
    moved = [any(w.any() for name, w in found.items() if "lora_B" in name) for found in weights]
    said = "no learning signal in 4 rollouts" in plain.stdout + plain.stderr
    warned = "returned `None`" in plain.stderr
    ok = updates.returncode == 0 and moved == [False, True] and said and not warned
    return ok, f"lora_B moves: plain {moved[0]}, always_update {moved[1]}; no-signal line: {said}"


def group_of_one(case: Case) -> tuple[bool, str]:
    return short(case.fit(RL, "--data.init_args.group_size=1"), "group_size: 1 cannot train GRPOPolicy")


def group_of_zero(case: Case) -> tuple[bool, str]:
    done = case.fit(RL, "--data.init_args.group_size=0")
    ok, message = short(done, "group_size and tasks_per_epoch must be at least 1")
    return ok and not (case.folder / "runs").exists(), message


# ----------------------------------------------------------------------------- 5. messages
def unknown_model(case: Case) -> tuple[bool, str]:
    return short(case.fit(RL[:6], "--model.init_args.policy.init_args.model=nosuchmodel"),
                 "unknown model 'nosuchmodel'")


def empty_model_folder(case: Case) -> tuple[bool, str]:
    (case.folder / "empty").mkdir()
    return short(case.fit(RL[:6], "--model.init_args.policy.init_args.model=empty"), "is neither a checkpoint folder")


def missing_merge_adapter(case: Case) -> tuple[bool, str]:
    return short(case.fit(RL, "--model.init_args.policy.init_args.merge_adapter=sft/adapters/last/default"),
                 "merge_adapter: no peft adapter at")


def yaml_error(case: Case) -> tuple[bool, str]:
    (case.folder / "mine.yaml").write_text("trainer:\n  max_epochs: [1\n")
    done = case.run("fit", "-c", str(CONFIGS / "quickstart_rl.yaml"), "-c", "mine.yaml")
    return done.returncode != 0 and 'in "mine.yaml", line 2' in done.stderr, error(done)[:150]


def other_base_adapter(case: Case) -> tuple[bool, str]:
    case.fit(RL, *UPDATES, "--trainer.max_epochs=1", "--model.init_args.policy.init_args.tiny.hidden_size=64")
    adapter = next(case.folder.glob("runs/*/*/adapters/last"))
    done = case.run("eval", "-c", str(CONFIGS / "quickstart_rl.yaml"), *TINY, "--trainer.enable_progress_bar=false",
                    "--adapter", str(adapter), "--tasks", "1")
    return short(done, "was trained on")


def offline_hub(case: Case) -> tuple[bool, str]:
    started = time.perf_counter()
    done = case.fit(RL[:6], "--model.init_args.policy.init_args.model=HuggingFaceTB/SmolLM2-135M-Instruct",
                    env={"HF_HUB_OFFLINE": ""})
    seconds = time.perf_counter() - started
    ok, message = short(done, "not in the local Hugging Face cache")
    return ok and seconds < 30, f"{seconds:.0f} s (imports included); {message[:100]}"


def view_bad_lines(case: Case) -> tuple[bool, str]:
    case.fit(RL)
    rollouts = next(case.folder.glob("runs/*/*/rollouts/train-epoch0000-rank0.jsonl"))
    rollouts.write_text(rollouts.read_text() + '{"half a line')
    done = case.run("view", str(rollouts), "--out", "page.html")
    (case.folder / "empty.jsonl").write_text("")
    empty = case.run("view", "empty.jsonl")
    ok = done.returncode == 0 and "skipped 1 line(s)" in done.stderr and empty.returncode != 0
    return ok, f"{done.stderr.strip()[:60]}...; empty file: {error(empty)[-40:]}"


def help_lists_commands(case: Case) -> tuple[bool, str]:
    listed = case.run("--help").stdout.split("Available subcommands:")[-1]
    names = [n for n in ("quickstart", "multi2", "demos", "eval", "view") if re.search(rf"\n\s+{n}\s", listed)]
    titles = "<function" not in case.run("fit", "--help").stdout
    return len(names) == 5 and titles, f"--help lists {names}; fit --help group titles clean: {titles}"


# ----------------------------------------------------------------------------- 6. between start and end
def epoch_lines(case: Case) -> tuple[bool, str]:
    done = case.fit(RL, *UPDATES, "--trainer.max_epochs=2")
    lines = [line for line in done.stderr.splitlines() if re.match(r"epoch \d+/1: ", line)]
    bars = [b for b in ("Loading weights", "Writing model shards") if b in done.stderr]
    return len(lines) == 2 and not bars, f"{lines[-1] if lines else 'no epoch line'}; third-party bars: {bars}"


def resume_epoch(case: Case) -> tuple[bool, str]:
    case.fit(RL, *UPDATES, "--trainer.max_epochs=1")
    done = case.fit(RL, *UPDATES, "--trainer.max_epochs=2", "--ckpt_path", "last")
    said = re.search(r"resuming from \S+ at epoch \d+ \(step \d+\)", done.stdout + done.stderr)
    return bool(said), said.group(0)[-40:] if said else "no line"


CASES: list[tuple[str, str, Callable[[Case], tuple[bool, str]]]] = [
    ("1a", "--ckpt_path last with a wrong override", failed_resume),
    ("1b", "resume from a corrupt last.ckpt", corrupt_last),
    ("2a", "mistyped data.init_args.path", mistyped_demos),
    ("2b", "empty demonstrations file", empty_demos),
    ("2c", "TextCraft-Synth demos for a TextCraft config", other_env_demos),
    ("2d", 'a demonstration with "action": null', null_action),
    ("3a", "lit-agents eval twice", eval_twice),
    ("3b", "a pinned logger version over an earlier run", pinned_version),
    ("3c", "a second quick start into the same --out", second_quickstart),
    ("3d", "lit-agents demos --out onto an existing file", demos_overwrite),
    ("4a", "the RL debug overlays (an untrained model)", debug_overlay),
    ("4b", "group_size: 1", group_of_one),
    ("4c", "group_size: 0", group_of_zero),
    ("5a", "an unknown model", unknown_model),
    ("5b", "an empty model folder", empty_model_folder),
    ("5c", "a missing merge_adapter", missing_merge_adapter),
    ("5d", "a YAML syntax error in a -c file", yaml_error),
    ("5e", "an adapter of another base model", other_base_adapter),
    ("5f", "a hub id offline (HF_HUB_OFFLINE unset)", offline_hub),
    ("5g", "lit-agents view on a corrupt line and an empty file", view_bad_lines),
    ("5h", "lit-agents --help, fit --help", help_lists_commands),
    ("6a", "a fit written to a file", epoch_lines),
    ("6b", "a resume", resume_epoch),
]


def main(argv: list[str] | None = None) -> int:
    global CACHE
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it (default: a temporary one)")
    parser.add_argument("--only", help="comma-separated case ids (default: all)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bad_input_")) if args.keep is None else args.keep
    CACHE = work / "cache"
    failed = 0
    for key, title, check in CASES:
        if args.only and key not in args.only.split(","):
            continue
        folder = work / key
        folder.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        try:
            ok, detail = check(Case(folder))
        except Exception as err:  # a case that crashes is a failed case, not the end of the replay
            ok, detail = False, f"{type(err).__name__}: {err}"[:150]
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {key} {title}: {detail} [{time.perf_counter() - started:.0f} s]",
              flush=True)
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


CACHE = Path(tempfile.gettempdir())

if __name__ == "__main__":
    sys.exit(main())
