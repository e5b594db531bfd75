"""Scale and reliability: DDP on CPU (gloo), resume after a kill, determinism."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "scripts"


def run_script(args: list[str], cwd: Path, timeout: float = 400) -> subprocess.CompletedProcess:
    """Run a script in its own process group; on timeout kill the whole group (DDP children too)."""
    env = {**os.environ, "HANG_DUMP_S": str(timeout - 20), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{args} timed out:\n{out[-4000:]}")
    return subprocess.CompletedProcess(args, proc.returncode, out, "")


@pytest.mark.parametrize("kind", ["grpo", "sft"])
def test_ddp_two_cpu_processes_stay_in_sync(kind, tmp_path):
    """2 ranks (gloo): each rolls out its own tasks, both end with identical trainable weights
    after the same number of steps, even when one rank has fewer batches (pad steps)."""
    done = run_script([str(SCRIPTS / "ddp_fit.py"), str(tmp_path), kind], cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["steps"] == ranks[1]["steps"] > 0
    assert ranks[0]["sums"].keys() == ranks[1]["sums"].keys() and ranks[0]["sums"]
    for name, value in ranks[0]["sums"].items():
        assert ranks[1]["sums"][name] == pytest.approx(value, rel=1e-6, abs=1e-8), name
    if kind == "grpo":
        for epoch0, epoch1 in zip(ranks[0]["tasks"], ranks[1]["tasks"]):
            assert epoch0 and epoch1 and not set(epoch0) & set(epoch1)  # distinct tasks per rank
        assert ranks[0]["pad_steps"] + ranks[1]["pad_steps"] > 0  # unequal batch counts happened
    assert (tmp_path / "adapters" / "last" / "default" / "adapter_config.json").exists()
