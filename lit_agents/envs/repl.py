"""A sandboxed Python REPL for agents that act by writing code (RAO).

Model code runs in a separate process (`_repl_worker.py`), never in the trainer's: a persistent
namespace per agent, captured and truncated output, a wall-clock limit (enforced here: the
worker's process group is killed and a fresh worker started), CPU-time, memory and file-size
limits (rlimits in the worker), its own session, a cleaned environment, a per-agent temporary
work directory, and an audit hook that refuses processes, signals, sockets, native code and
files or directories outside the work directory (see the worker's docstring). Every error and
every limit breach comes back as text for the model, never as an exception in the trainer.

Tool calls cross the process boundary as messages: the code calls a stub (``craft(...)``), the
worker sends ``call``, and whoever drives the REPL answers it. Two ways to drive it:

- ``run(code, handler)``: synchronous; ``handler(name, args, kwargs)`` returns the value or
  raises (its message reaches the code as ``ToolError``).
- ``submit(code)`` then ``poll()`` / ``respond(call_id, ...)``: step-wise, so an agent loop can
  collect the pending ``launch_subagent`` calls of many REPLs, play the children batched, and
  answer them later (the code awaits them, concurrently with ``asyncio.gather``).

Known limits: Python-level containment plus rlimits, not a kernel sandbox (no seccomp, no
namespaces): run untrusted models on machines you can afford to lose. As root, rlimits that only
apply to unprivileged users (process counts) do not hold; the audit hook refuses fork and spawn
instead.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WORKER = Path(__file__).with_name("_repl_worker.py")


@dataclass
class ToolCall:
    """A tool call the code is waiting on."""

    call_id: int
    name: str
    args: list[Any]
    kwargs: dict[str, Any]
    is_async: bool


@dataclass
class ReplResult:
    """How an execution ended: ``output`` (stdout + stderr, truncated), ``error`` (traceback or a
    limit's message, None when it ran through), ``calls`` made, ``restarted`` (the namespace was
    lost: a limit killed the worker)."""

    output: str = ""
    error: str | None = None
    truncated: bool = False
    calls: list[ToolCall] = field(default_factory=list)
    restarted: bool = False

    def observation(self) -> str:
        """What the model is shown."""
        text = self.output + ("\n[output truncated]" if self.truncated else "")
        if self.error:
            text += ("\n" if text else "") + self.error
        return text.strip() or "(no output)"


class PythonREPL:
    """One agent's sandboxed REPL.

    Args:
        tools: names of synchronous tool functions in the namespace.
        async_tools: names of awaitable tool functions (e.g. ``launch_subagent``).
        timeout_s: wall-clock limit of one execution (tool calls' time included).
        cpu_s: CPU-seconds limit of the worker process over its life.
        memory_mb: address-space limit of the worker.
        file_mb: largest file the code may write.
        max_output_chars: output kept per execution.
        workdir: the work directory (default: a fresh temporary directory, removed on close).
        grace_s: how long `poll` waits for more awaitable calls before handing them over.
    """

    def __init__(
        self,
        tools: list[str] | tuple[str, ...] = (),
        async_tools: list[str] | tuple[str, ...] = (),
        timeout_s: float = 10.0,
        cpu_s: int = 60,
        memory_mb: int = 1024,
        file_mb: int = 16,
        max_output_chars: int = 4000,
        workdir: str | None = None,
        grace_s: float = 0.05,
    ) -> None:
        self.timeout_s, self.grace_s = timeout_s, grace_s
        self.limits = {"tools": list(tools), "async_tools": list(async_tools), "cpu_s": cpu_s,
                       "memory_mb": memory_mb, "file_mb": file_mb, "max_output_chars": max_output_chars}
        self._own_dir = workdir is None
        self.workdir = tempfile.mkdtemp(prefix="lit_agents_repl_") if workdir is None else workdir
        self._proc: subprocess.Popen | None = None
        self._buffer = b""
        self._deadline = 0.0
        self._paused_at: float | None = None
        self._pending: dict[int, ToolCall] = {}
        self._calls: list[ToolCall] = []
        self._start()

    # ------------------------------------------------------------------ process
    def _start(self) -> None:
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-u", str(WORKER), self.workdir, json.dumps(self.limits)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
            cwd=self.workdir, start_new_session=True, close_fds=True,
        )
        self._buffer = b""
        ready = self._read(time.monotonic() + 30.0)
        if ready is None or ready.get("op") != "ready":
            self._kill()
            raise RuntimeError("the REPL worker did not start")

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.kill()
            proc.wait(timeout=5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()

    def _read(self, deadline: float) -> dict[str, Any] | None:
        """The next protocol message, or None on timeout or a dead worker."""
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(timeout=left):
                    return None
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return None
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            return None

    def _write(self, message: dict[str, Any]) -> bool:
        try:
            assert self._proc is not None and self._proc.stdin is not None
            self._proc.stdin.write((json.dumps(message) + "\n").encode())
            self._proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError, AssertionError):
            return False

    # ------------------------------------------------------------------ driving
    def submit(self, code: str) -> None:
        """Start executing ``code`` (then `poll`)."""
        if self._proc is None:
            self._start()
        self._pending, self._calls, self._paused_at = {}, [], None
        self._deadline = time.monotonic() + self.timeout_s
        self._write({"op": "exec", "code": code})  # a dead worker shows up in `poll`

    def poll(self) -> list[ToolCall] | ReplResult:
        """Wait until the code needs tool results (the unanswered calls) or has finished.

        A synchronous call blocks the code, so it comes back at once; awaitable calls come back
        when the worker reports the calls started in one event-loop turn are all out (calls
        started together under ``asyncio.gather`` come back together), or after ``grace_s``
        without a new call.
        """
        while True:
            if any(not c.is_async for c in self._pending.values()):
                self._paused_at = time.monotonic()
                return list(self._pending.values())
            until = self._deadline if not self._pending else min(self._deadline, time.monotonic() + self.grace_s)
            message = self._read(until)
            if message is None:
                alive = self._proc is not None and self._proc.poll() is None
                if self._pending and alive and time.monotonic() < self._deadline:
                    self._paused_at = time.monotonic()
                    return list(self._pending.values())
                return self._broken()
            if message["op"] == "call":
                call = ToolCall(message["id"], message["name"], message["args"], message["kwargs"], message["async"])
                self._pending[call.call_id] = call
                self._calls.append(call)
            elif message["op"] == "waiting" and self._pending:
                self._paused_at = time.monotonic()
                return list(self._pending.values())
            elif message["op"] == "done":
                return ReplResult(message["output"], message["error"], message["truncated"], list(self._calls))

    def respond(self, call_id: int, value: Any = None, error: str | None = None) -> None:
        """Answer a tool call (``error``: raised in the code as ``ToolError``). The time the code
        waited for its calls does not count against ``timeout_s``."""
        self._pending.pop(call_id, None)
        if self._paused_at is not None and not self._pending:
            self._deadline += time.monotonic() - self._paused_at
            self._paused_at = None
        message = {"op": "result", "id": call_id}
        message.update({"error": error} if error is not None else {"value": value})
        self._write(message)

    def _broken(self) -> ReplResult:
        """Timeout or a dead worker (CPU or memory limit, a crash): kill, restart, report."""
        timed_out = time.monotonic() >= self._deadline and self._proc is not None and self._proc.poll() is None
        code = None if self._proc is None else self._proc.poll()
        self._kill()
        if timed_out:
            why = f"TimeoutError: the code ran past {self.timeout_s:g} s"
        elif code is not None and code < 0:
            why = f"the REPL process was killed by {signal.Signals(-code).name} (a CPU, memory or crash limit)"
        else:
            why = "the REPL process died"
        self._start()
        return ReplResult(error=f"{why}; the REPL was restarted and its variables are lost", calls=list(self._calls),
                          restarted=True)

    def run(self, code: str, handler: Callable[[str, list, dict], Any] | None = None) -> ReplResult:
        """Execute ``code`` to the end, answering every tool call with ``handler``."""
        self.submit(code)
        while True:
            step = self.poll()
            if isinstance(step, ReplResult):
                return step
            if not step:
                continue
            # answer async calls only when the code is blocked on them (poll returned them all)
            for call in step:
                try:
                    if handler is None:
                        raise KeyError(f"no handler for tool {call.name!r}")
                    self.respond(call.call_id, value=handler(call.name, call.args, call.kwargs))
                except Exception as err:  # the tool's error goes to the code, not the trainer
                    self.respond(call.call_id, error=f"{type(err).__name__}: {err}")

    def close(self) -> None:
        self._kill()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> PythonREPL:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
