"""Every command the README, docs/gpu.md and the configs' headers give still runs, checked cheaply:

- ``lit-agents fit ...``: parsed with ``--print_config`` (every key known, every value typed);
- ``lit-agents quickstart|multi2 ...``: the pipeline's ``--dry-run`` (each stage's fit parsed);
- ``lit-agents eval ...``: its own options parsed, and its overrides against the config when it is
  one of configs/; ``lit-agents view|demos ...``: run for real on a tiny input;
- ``python benchmarks/x.py ...`` and ``python research/x.py ...``: the script's own argument
  parser on these arguments (the script stops right after parsing);
- ``torchrun``/``srun`` lines: the ``lit-agents`` command they launch; ``make T``: a Makefile
  target; other programs must be on a short list of known tools.

Shell variables set in a block (``SFT=runs/x/seed0``) are substituted in the lines after them, as
a shell would. The README's shape is checked too: under 150 lines, the first command within the
first 30, no paragraph over 120 words."""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import inspect
import io
import re
import runpy
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from lit_agents.cli import main
from lit_agents.pipelines import evaluate

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", ROOT / "docs" / "gpu.md", ROOT / "docs" / "scaling.md"]
CONFIG_HEADERS = sorted((ROOT / "configs").rglob("*.yaml"))
# programs a page may name that this test does not run: installers, viewers, launchers' own flags
KNOWN_TOOLS = {"pip", "xdg-open", "nvidia-smi", "sbatch", "tensorboard", "export", "cd"}
ASSIGNMENT = re.compile(r"^(?:export\s+)?([A-Z_][A-Z0-9_]*)=(\S+)$")


@dataclass
class Command:
    where: str  # file:line
    argv: list[str]
    env: dict[str, str]  # NAME=value prefixes (PYTHONPATH=examples lit-agents ...)

    def __str__(self) -> str:
        return f"{self.where}: {shlex.join(self.argv)}"


def _blocks_of_markdown(text: str) -> list[list[tuple[int, str]]]:
    """The lines of each fenced bash block, with their line numbers."""
    blocks, block = [], None
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            if block is None and line.strip() in ("```bash", "```sh", "```shell"):
                block = []
            elif block is not None:
                blocks.append(block)
                block = None
            continue
        if block is not None:
            block.append((number, line))
    return blocks


def _blocks_of_yaml_header(text: str) -> list[list[tuple[int, str]]]:
    """A config's header comments indent their commands: ``#   lit-agents fit ...``."""
    blocks, block = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("#"):
            break
        body = line[1:]
        if body.startswith("   ") and body.strip():
            block.append((number, body.strip()))
        elif block:
            blocks.append(block)
            block = []
    return blocks + ([block] if block else [])


def commands(blocks: list[list[tuple[int, str]]], where: str) -> list[Command]:
    """The commands of each block, continuation lines joined, comments dropped, the block's
    variables substituted."""
    found = []
    for block in blocks:
        variables: dict[str, str] = {}
        pending, start = "", 0
        for number, line in block:
            pending, start = (pending + " " + line.strip(), start) if pending else (line.strip(), number)
            if pending.endswith("\\"):
                pending = pending[:-1]
                continue
            words, pending = shlex.split(pending, comments=True), ""
            if not words:
                continue
            if len(words) == 1 and (m := ASSIGNMENT.match(words[0])):
                variables[m.group(1)] = m.group(2)
                continue
            words = [re.sub(r"\$\{?([A-Z_][A-Z0-9_]*)\}?", lambda m: variables.get(m.group(1), m.group(0)), w)
                     for w in words]
            env = {}
            while words and "=" in words[0] and ASSIGNMENT.match(words[0]):
                name, value = words.pop(0).split("=", 1)
                env[name] = value
            found.append(Command(f"{where}:{start}", words, env))
    return found


def _page_commands() -> list[Command]:
    found = []
    for page in PAGES:
        if page.exists():
            found += commands(_blocks_of_markdown(page.read_text()), str(page.relative_to(ROOT)))
    for config in CONFIG_HEADERS:
        found += commands(_blocks_of_yaml_header(config.read_text()), str(config.relative_to(ROOT)))
    unique = {}  # a command given in several places is checked once, under its first place
    for command in found:
        unique.setdefault((tuple(command.argv), tuple(sorted(command.env.items()))), command)
    return list(unique.values())


COMMANDS = _page_commands()


class _Parsed(Exception):
    """Raised by the patched argument parser once a script's arguments have parsed."""


@contextlib.contextmanager
def _stop_after_parsing(monkeypatch):
    """argparse parses as usual (errors exit 2), then stops the script before it runs."""
    known = argparse.ArgumentParser.parse_known_args

    def parse_args(self, args=None, namespace=None):
        namespace, extra = known(self, args, namespace)
        if extra:
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        raise _Parsed(namespace)

    def parse_known_args(self, args=None, namespace=None):
        raise _Parsed(known(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", parse_known_args)
    yield


def _fit_parses(args: list[str]) -> None:
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as exit_:
        main(["fit", *args, "--print_config"])
    assert exit_.value.code == 0, f"does not parse: lit-agents fit {shlex.join(args)}"


def _tiny_rollouts(folder: Path) -> None:
    from lit_agents.types import Call, Rollout, Session

    folder.mkdir(parents=True, exist_ok=True)
    call = Call([1], [2], [0.0], prompt_text="goal: craft 1 stick", completion_text="craft 1 stick")
    rollout = Rollout("t0", 0, [Session(0, "main", None, 0, [call])], 1.0, True)
    import json

    (folder / "train-epoch0000-rank0.jsonl").write_text(json.dumps(rollout.to_dict()) + "\n")


def _run_lit_agents(args: list[str], tmp_path: Path, monkeypatch) -> None:
    sub, rest = args[0], args[1:]
    if sub == "fit":
        _fit_parses(rest)
    elif sub in ("quickstart", "multi2"):
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            main([sub, *rest, "--dry-run"])
        assert "lit-agents fit" in printed.getvalue()
    elif sub == "eval":
        options, overrides = evaluate.parse(rest)
        if all((ROOT / c).is_file() for c in options.config):
            _fit_parses([a for c in options.config for a in ("-c", c)] + overrides)
    elif sub in ("view", "demos"):
        monkeypatch.chdir(tmp_path)
        for folder in ("configs", "examples"):
            (tmp_path / folder).symlink_to(ROOT / folder)
        if sub == "view":
            for path in (p for p in rest if not p.startswith("-") and not p.endswith(".html")):
                _tiny_rollouts(tmp_path / path)
        main([sub, *rest, *(["--limit", "2"] if sub == "demos" else [])])
    else:
        with contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as exit_:
            main([sub, *rest])
        assert exit_.value.code == 0


def _check_snippet(code: str) -> None:
    """``python -c CODE``: it compiles, its imports resolve, and each call of an imported class or
    function names parameters it has and methods it has (nothing is run: it would load a model)."""
    tree = ast.parse(code)
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = importlib.import_module(node.module)
            names.update({a.asname or a.name: getattr(module, a.name) for a in node.names})
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names:
            inspect.signature(names[node.func.id]).bind_partial(**{k.arg: None for k in node.keywords})
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Call) \
                and isinstance(node.value.func, ast.Name) and node.value.func.id in names:
            assert hasattr(names[node.value.func.id], node.attr), f"no {node.value.func.id}.{node.attr}"


def _run_script(args: list[str], monkeypatch) -> None:
    if args[0] == "-c":
        return _check_snippet(args[1])
    script = ROOT / args[0]
    assert script.is_file() and script.parent.name in ("benchmarks", "research"), f"no such script: {args[0]}"
    monkeypatch.syspath_prepend(str(script.parent))
    monkeypatch.setattr(sys, "argv", [str(script), *args[1:]])
    with _stop_after_parsing(monkeypatch), pytest.raises(_Parsed):
        runpy.run_path(str(script), run_name="__main__")


def _launched(argv: list[str]) -> list[str]:
    """The lit-agents command a launcher line (torchrun, srun) starts."""
    for i, word in enumerate(argv):  # lit-agents, $(which lit-agents) (split by the shell), -m lit_agents.cli
        if word.rstrip(")").endswith("lit-agents") or word == "lit_agents.cli":
            return argv[i + 1:]
    raise AssertionError(f"{argv[0]} launches no lit-agents command")


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_the_command_runs(command, tmp_path, monkeypatch):
    argv = command.argv
    if "PYTHONPATH" in command.env:
        monkeypatch.syspath_prepend(str(ROOT / command.env["PYTHONPATH"]))
    monkeypatch.chdir(ROOT)
    if argv[0] == "lit-agents":
        _run_lit_agents(argv[1:], tmp_path, monkeypatch)
    elif argv[0] in ("torchrun", "srun"):
        _run_lit_agents(_launched(argv), tmp_path, monkeypatch)
    elif argv[0] in ("python", "python3"):
        _run_script(argv[1:], monkeypatch)
    elif argv[0] == "make":
        targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M)
        assert set(argv[1:]) <= set(targets), f"no such make target: {argv[1:]}"
    else:
        assert argv[0] in KNOWN_TOOLS, f"{command}: an unknown program; run it here or add it to KNOWN_TOOLS"


def test_the_commands_are_found():
    where = {c.where.split(":")[0] for c in COMMANDS}
    assert {"README.md", "docs/gpu.md", "configs/rao/recursive.yaml"} <= where
    readme = [shlex.join(c.argv) for c in COMMANDS if c.where.startswith("README.md")]
    assert "make quickstart" in readme and "make test" in readme
    # every method's SFT -> RL chain, the RL stage reading the SFT run through a variable
    for config in ("quickstart_rl_smollm2", "mosaic/forking_mosaic", "rao/recursive", "rao/recursive_smollm2"):
        chain = [c for c in readme if f"configs/{config}.yaml" in c and "/seed0/adapters/last/" in c]
        assert chain, config
    assert any(c.startswith("lit-agents multi2") and "smollm2-135m" in c for c in readme)


def test_commands_are_read_as_a_shell_reads_them():
    blocks = _blocks_of_markdown("```bash\nSFT=runs/a/seed0   # the SFT run\nlit-agents fit -c x.yaml \\\n"
                                 "  --m=$SFT/adapters   # RL\nPYTHONPATH=examples lit-agents fit -c y.yaml\n```\n")
    first, second = commands(blocks, "page")
    assert first.argv == ["lit-agents", "fit", "-c", "x.yaml", "--m=runs/a/seed0/adapters"] and first.where == "page:3"
    assert second.env == {"PYTHONPATH": "examples"} and second.argv[:2] == ["lit-agents", "fit"]
    header = _blocks_of_yaml_header("# A config.\n#   lit-agents fit -c a.yaml \\\n#     --x=1\n# prose\nkey: 1\n")
    assert [c.argv for c in commands(header, "c")] == [["lit-agents", "fit", "-c", "a.yaml", "--x=1"]]


def test_a_command_that_no_longer_parses_fails(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(AssertionError):
        _run_lit_agents(["fit", "-c", "configs/quickstart_rl.yaml", "--model.init_args.lrr=1"], tmp_path, monkeypatch)
    with pytest.raises(SystemExit):
        _run_lit_agents(["multi2", "--stages", "system1_sft", "--set", "model.init_args.lrr=1"], tmp_path, monkeypatch)
    with pytest.raises(SystemExit):
        _run_script(["benchmarks/rollout.py", "--no-such-flag"], monkeypatch)


def _paragraphs(markdown: str) -> list[str]:
    """Prose paragraphs: code fences, tables and headings left out, each list item on its own."""
    paragraphs, current, fence = [], [], False
    for line in markdown.splitlines() + [""]:
        if line.startswith("```"):
            fence = not fence
        starts_item = line.lstrip().startswith(("- ", "* "))
        if fence or line.startswith(("```", "|", "#")) or not line.strip() or starts_item:
            if current:
                paragraphs.append(" ".join(current))
            current = [line] if starts_item and not fence else []
            continue
        current.append(line)
    return paragraphs


def test_the_readme_is_a_landing_page():
    text = (ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) < 150
    first = next(c for c in COMMANDS if c.where.startswith("README.md"))
    assert int(first.where.split(":")[1]) <= 30, first
    long = [(len(p.split()), p[:60]) for p in _paragraphs(text) if len(p.split()) > 120]
    assert not long, f"paragraphs over 120 words (a table or a list reads better): {long}"
    assert "docs/algorithms.md" in text and "docs/architecture.md" in text and "design folder" not in text


def test_the_license_is_the_one_pyproject_declares():
    assert 'license = "Apache-2.0"' in (ROOT / "pyproject.toml").read_text()
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
