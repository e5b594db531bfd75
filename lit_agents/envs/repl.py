"""A sandboxed Python REPL for agents that act by writing code (RAO).

Model code runs in a separate process (`_repl_worker.py`), never in the trainer's: a persistent
namespace per agent, captured and truncated output, a time limit per execution counted in the
worker's CPU seconds and a longer wall-clock backstop (both enforced here: the worker is killed
and a fresh worker started), CPU-time, memory and file-size limits over the worker's life
(rlimits in the worker), its own session, a cleaned environment, a per-agent temporary
work directory, the kernel sandbox below, and an audit hook that names what it refuses
(processes, signals, sockets, native code, files or directories outside the work directory).
Every error and every limit breach comes back as text for the model, never as an exception in
the trainer.

Tool calls cross the process boundary as messages: the code calls a stub (``craft(...)``), the
worker sends ``call``, and whoever drives the REPL answers it. Two ways to drive it:

- ``run(code, handler)``: synchronous; ``handler(name, args, kwargs)`` returns the value or
  raises (its message reaches the code as ``ToolError``).
- ``submit(code)`` then ``poll()`` / ``respond(call_id, ...)``: step-wise, so an agent loop can
  collect the pending ``launch_subagent`` calls of many REPLs, play the children batched, and
  answer them later (the code awaits them, concurrently with ``asyncio.gather``).

The trainer never waits on the worker without a deadline: reads and writes both go through
`poll`'s wait (the command pipe is non-blocking; what it does not take yet waits in an outbox),
so a worker that stops reading or never stops writing meets the wall clock; at most
``max_pending_calls`` calls wait for answers at once (the rest are refused at once, as a
``ToolError`` in the code); and a message of the wrong shape ends the worker. Nothing the worker
sends is trusted.

Threat model (docs/sandbox.md): the model's code is an attacker that fully controls the
worker's Python interpreter (it can rewrite the audit hook, load ctypes, make raw syscalls).
Containment is therefore the kernel's, applied by the worker to itself before any model code
runs (``containment="kernel"``, the default):

=========================  ===============================================================
layer                      stops
=========================  ===============================================================
identity (as root)         uid/gid 65534, no groups, no capabilities, ``no_new_privs``:
                           signals, ptrace and ``/proc`` of root processes, regaining
                           privileges
filesystem (Landlock)      reads outside the interpreter, system libraries and work
                           directory (``/etc/shadow``, ``/proc/1/environ``, the trainer's
                           files); any write outside the work directory
network (seccomp)          ``socket``/``connect``/``bind`` refused (a Unix ``socketpair``
                           only, for asyncio); Landlock: no TCP, no abstract sockets outside
processes (seccomp)        fork, clone without ``CLONE_THREAD``, exec, ptrace, signals to any
                           other process (Landlock too), namespaces, mounts, raising rlimits,
                           bpf, keyctl, io_uring: ``EPERM``, so the worker lives and says so
limits (rlimits, trainer)  CPU seconds, address space, file size, open files; CPU seconds
                           and wall clock per execution
audit hook                 nothing by itself: turns ordinary mistakes into clear messages
=========================  ===============================================================

A machine lacking a layer (no Landlock or ABI < 3, no seccomp, no ``libseccomp.so.2``) gets
`SandboxUnavailable` (logged once) and no model code runs, unless the weaker mode is chosen by
name: ``containment="python-only"`` (audit hook and rlimits only, escapable).

Workers are forked from a zygote (``spawn="zygote"``, the default): one warm process per trainer
process, started on first use with the worker's modules loaded and nothing applied, forks a
worker per REPL, which then sets its own sandbox up as a freshly started one would. A REPL then
starts in milliseconds instead of an interpreter start (``benchmarks/repl_start.py``), which
dominates expert trees and shallow rollouts, where every node is a new REPL. ``spawn="exec"``
starts a fresh interpreter per REPL.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

#: how a node's system message describes the async tool ``launch_subagent`` (`RecursiveAgent`)
LAUNCH_DOC = (
    "await launch_subagent(goal) -> str runs a subagent (this same model, a fresh context) on a "
    "sub-goal in the goal language, sharing your inventory, and returns its final answer; start "
    "several at once with asyncio.gather. "
)

log = logging.getLogger(__name__)
WORKER = Path(__file__).with_name("_repl_worker.py")
CONTAINMENTS = ("kernel", "python-only")
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_INTERPRETER = [sys.executable, "-I", "-S", "-u", str(WORKER)]  # isolated, no site: the stdlib only


class _Zygote:
    """The warm process that forks this trainer process's REPL workers (see the worker's docstring)."""

    def __init__(self) -> None:
        self.owner, self.lock = os.getpid(), threading.Lock()
        ours, theirs = socket.socketpair()
        self.proc = subprocess.Popen(
            [*_INTERPRETER, "--zygote", str(theirs.fileno())], pass_fds=(theirs.fileno(),), env=_ENV, cwd="/",
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        theirs.close()
        ours.settimeout(30.0)
        self.sock, self.replies = ours, ours.makefile("rb")

    def alive(self) -> bool:
        return self.owner == os.getpid() and self.proc.poll() is None

    def request(self, message: dict[str, Any], fds: tuple[int, ...] = ()) -> dict[str, Any]:
        with self.lock:
            data = (json.dumps(message) + "\n").encode()
            if fds:
                socket.send_fds(self.sock, [data], list(fds))
            else:
                self.sock.sendall(data)
            line = self.replies.readline()
        if not line:
            raise OSError("the REPL zygote exited")
        return json.loads(line)



_zygote: _Zygote | None = None
_zygote_lock = threading.Lock()


def _spawn(workdir: str, limits: dict[str, Any], fds: tuple[int, int]) -> int:
    """Fork a worker from this process's zygote (started, or restarted, as needed): its pid."""
    global _zygote
    with _zygote_lock:
        for attempt in range(2):
            if _zygote is None or not _zygote.alive():
                _zygote = _Zygote()
            try:
                return int(_zygote.request({"op": "spawn", "workdir": workdir, "limits": limits}, fds)["pid"])
            except (OSError, ValueError, KeyError):
                if attempt:
                    raise
                _zygote = None
    raise AssertionError("unreachable")


def _end(pid: int) -> int | None:
    """Kill and reap a forked worker: its exit code (negative: the signal), None if unknown."""
    zygote = _zygote
    if zygote is None or not zygote.alive():
        return None  # the zygote died and took the reaping of its workers with it
    try:
        return zygote.request({"op": "end", "pid": pid})["status"]
    except (OSError, ValueError, KeyError):
        return None


class SandboxUnavailable(RuntimeError):
    """This machine lacks a layer of the ``"kernel"`` containment: no model code is run."""


_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message)


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


#: the longest protocol line the trainer reads from a worker (a longer one is a violation)
MAX_LINE_BYTES = 8 << 20


def _tool_call(message: dict[str, Any]) -> ToolCall | None:
    """The worker's ``call`` message as a `ToolCall`, None if it is not a well-formed one (the
    worker's interpreter is the code's: nothing it sends is trusted)."""
    fields = (message.get(k) for k in ("id", "name", "args", "kwargs", "async"))
    call_id, name, args, kwargs, is_async = fields
    if (message.get("op") != "call" or type(call_id) is not int or not isinstance(name, str)
            or not isinstance(args, list) or not isinstance(kwargs, dict) or not isinstance(is_async, bool)
            or not all(isinstance(k, str) for k in kwargs)):
        return None
    return ToolCall(call_id, name, args, kwargs, is_async)


def _done(message: dict[str, Any], calls: list[ToolCall]) -> ReplResult:
    """The worker's ``done`` message as a `ReplResult` (fields of the wrong type read as empty)."""
    output, error = message.get("output"), message.get("error")
    return ReplResult(output if isinstance(output, str) else "", error if isinstance(error, str) else None,
                      message.get("truncated") is True, list(calls))


class PythonREPL:
    """One agent's sandboxed REPL.

    Args:
        tools: names of synchronous tool functions in the namespace.
        async_tools: names of awaitable tool functions (e.g. ``launch_subagent``).
        timeout_s: time limit of one execution in the worker's CPU seconds (all its threads,
            read from the kernel's accounting in ``/proc``): the same code times out or not
            whatever else loads the machine. Waiting for tool calls uses none.
        wall_timeout_s: wall-clock backstop of one execution (time waiting for tool calls
            excluded), for code that sleeps or blocks and so uses no CPU.
        cpu_s: CPU-seconds limit of the worker process over its life (``RLIMIT_CPU``).
        memory_mb: address-space limit of the worker.
        file_mb: largest file the code may write.
        max_output_chars: output kept per execution.
        workdir: the work directory (default: a fresh temporary directory, removed on close).
        grace_s: how long `poll` waits for more awaitable calls before handing them over.
        max_pending_calls: the most tool calls one execution may have waiting for an answer at
            once; a call past it is answered at once with an error (``ToolError`` in the code),
            so a flood of ``asyncio.gather`` calls ends in a readable error, not a backlog.
        spawn: ``"zygote"`` forks the worker from a warm process (fast); ``"exec"`` starts a fresh
            interpreter.
        containment: ``"kernel"`` (the default): the worker drops its identity, and Landlock and
            seccomp confine it (docs/sandbox.md); on a machine lacking one of these layers the
            REPL raises `SandboxUnavailable` and runs nothing. ``"python-only"``: only the audit
            hook and rlimits, which code that owns the interpreter escapes; chosen by name, for
            trusted code or machines you can afford to lose.

    Attributes:
        layers: the kernel layers the current worker applied (empty under ``"python-only"``).
    """

    def __init__(
        self,
        tools: list[str] | tuple[str, ...] = (),
        async_tools: list[str] | tuple[str, ...] = (),
        timeout_s: float = 10.0,
        wall_timeout_s: float = 30.0,
        cpu_s: int = 60,
        memory_mb: int = 1024,
        file_mb: int = 16,
        max_output_chars: int = 4000,
        workdir: str | None = None,
        grace_s: float = 0.05,
        max_pending_calls: int = 64,
        spawn: Literal["zygote", "exec"] = "zygote",
        containment: Literal["kernel", "python-only"] = "kernel",
    ) -> None:
        if spawn not in ("zygote", "exec"):
            raise ValueError(f"spawn must be 'zygote' or 'exec', not {spawn!r}")
        if containment not in CONTAINMENTS:
            raise ValueError(f"containment must be one of {CONTAINMENTS}, not {containment!r}")
        if containment == "python-only":
            _warn_once("python-only", "REPL containment 'python-only' (chosen by name): model code runs with the "
                       "trainer's identity behind an audit hook that code owning the interpreter can switch off; "
                       "no kernel sandbox (docs/sandbox.md)")
        if max_pending_calls < 1:
            raise ValueError(f"max_pending_calls must be >= 1, got {max_pending_calls}")
        self.timeout_s, self.wall_timeout_s, self.grace_s, self.spawn = timeout_s, wall_timeout_s, grace_s, spawn
        self.max_pending_calls = max_pending_calls
        self.limits = {"tools": list(tools), "async_tools": list(async_tools), "cpu_s": cpu_s,
                       "memory_mb": memory_mb, "file_mb": file_mb, "max_output_chars": max_output_chars,
                       "containment": containment}
        self.containment, self.layers = containment, {}
        self._own_dir = workdir is None
        self.workdir = tempfile.mkdtemp(prefix="lit_agents_repl_") if workdir is None else workdir
        self._proc: subprocess.Popen | None = None  # spawn="exec"
        self.pid: int | None = None
        self._commands: Any = None  # our ends of the worker's pipes (binary files)
        self._protocol: Any = None
        self._eof = False
        self._buffer = b""
        self._outbox = bytearray()  # messages for the worker not yet written (the pipe is non-blocking)
        self._violation: str | None = None  # the worker broke the protocol: it is ended at the next poll
        self._deadline = 0.0
        self._cpu_at_submit: float | None = None
        self._left, self._check_cpu = timeout_s, False  # CPU seconds left at the last reading; read on next poll
        self._paused_at: float | None = None
        self._pending: dict[int, ToolCall] = {}
        self._calls: list[ToolCall] = []
        self._start()

    # ------------------------------------------------------------------ process
    def _start(self) -> None:
        self._buffer, self._eof, self._outbox, self._violation = b"", False, bytearray(), None
        if self.spawn == "exec":
            self._proc = subprocess.Popen(
                [*_INTERPRETER, self.workdir, json.dumps(self.limits)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, env=_ENV, cwd=self.workdir, start_new_session=True, close_fds=True,
            )
            self.pid, self._commands, self._protocol = self._proc.pid, self._proc.stdin, self._proc.stdout
        else:
            commands_r, commands_w = os.pipe()
            protocol_r, protocol_w = os.pipe()
            try:
                self.pid = _spawn(self.workdir, self.limits, (commands_r, protocol_w))
            except Exception:
                for fd in (commands_r, commands_w, protocol_r, protocol_w):
                    os.close(fd)
                raise RuntimeError("the REPL zygote could not fork a worker") from None
            os.close(commands_r)
            os.close(protocol_w)
            self._commands, self._protocol = os.fdopen(commands_w, "wb"), os.fdopen(protocol_r, "rb", buffering=0)
        # never block on the worker: writes go out as the pipe takes them (`_flush`), under the
        # same deadlines as reads, so a worker that stops reading cannot stall the trainer
        os.set_blocking(self._commands.fileno(), False)
        ready = self._read(time.monotonic() + 30.0)
        if ready is not None and ready.get("op") == "refused":
            self._kill()
            message = (f"the REPL sandbox lacks a layer on this machine ({ready['error']}), so no model code is run. "
                       "To run it with the Python-level checks only (which code owning the interpreter switches off), "
                       "choose that by name: PythonREPL(containment='python-only'), RecursiveAgent("
                       "repl_containment='python-only'), or `repl_containment: python-only` in the agent's YAML "
                       "(docs/sandbox.md)")
            _warn_once(f"refused:{ready.get('layer')}", message)
            raise SandboxUnavailable(message)
        if ready is None or ready.get("op") != "ready":
            self._kill()
            raise RuntimeError("the REPL worker did not start")
        self.layers = ready.get("layers") or {}

    def _kill(self) -> int | None:
        """End the worker: its exit code (negative: the signal that ended it), if known."""
        pid, proc, self.pid, self._proc = self.pid, self._proc, None, None
        if pid is None:
            return None
        code = None
        if proc is not None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.kill()
                code = proc.wait(timeout=5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        else:
            code = _end(pid)
        for pipe in (self._commands, self._protocol):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass
        self._commands = self._protocol = None
        self._outbox.clear()
        return code

    def _read(self, deadline: float) -> dict[str, Any] | None:
        """The next protocol message, or None on timeout or a dead worker; meanwhile writes what
        the outbox holds as the command pipe takes it. A line that is not a JSON object, or one
        longer than `MAX_LINE_BYTES`, is a protocol violation (`_violation`; None)."""
        assert self._protocol is not None and self._commands is not None
        fd, out = self._protocol.fileno(), self._commands.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                if len(self._buffer) > MAX_LINE_BYTES:
                    return self._violate(f"a message over {MAX_LINE_BYTES} bytes")
                writing = bool(self._outbox)
                if writing:
                    sel.register(out, selectors.EVENT_WRITE)
                # look at least once: a message already there is not lost to a late caller
                events = sel.select(timeout=max(0.0, deadline - time.monotonic()))
                if writing:
                    sel.unregister(out)
                if not events:
                    return None
                if any(key.fd == out for key, _ in events):
                    self._flush()
                if not any(key.fd == fd for key, _ in events):
                    continue
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    self._eof = True  # the worker is gone
                    return None
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            message = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            message = None
        return message if isinstance(message, dict) else self._violate("a message that is not a JSON object")

    def _violate(self, what: str) -> None:
        self._violation = self._violation or what
        return None

    def _write(self, message: dict[str, Any]) -> None:
        """Queue a message for the worker and write what the pipe takes now, without waiting: the
        rest goes out while `poll` waits (a dead worker shows up there)."""
        if self._commands is not None:
            self._outbox += (json.dumps(message) + "\n").encode()
            self._flush()

    def _flush(self) -> None:
        """Write as much of the outbox as the command pipe takes without blocking."""
        while self._outbox and self._commands is not None:
            try:
                written = os.write(self._commands.fileno(), self._outbox[: 1 << 16])
            except BlockingIOError:
                return
            except OSError:  # the worker is gone: `poll` finds its end of file
                self._outbox.clear()
                return
            del self._outbox[:written]

    # ------------------------------------------------------------------ driving
    def submit(self, code: str) -> None:
        """Start executing ``code`` (then `poll`)."""
        if self.pid is None:
            self._start()
        self._pending, self._calls, self._paused_at = {}, [], None
        self._deadline = time.monotonic() + self.wall_timeout_s
        self._cpu_at_submit, self._left, self._check_cpu = self._cpu_seconds(), self.timeout_s, False
        self._write({"op": "exec", "code": code})  # a dead worker shows up in `poll`

    def _cpu_seconds(self) -> float | None:
        """CPU seconds the worker has used (all its threads, user and system), from the kernel's
        accounting; None when ``/proc`` does not say (then only the wall clock and the worker's
        ``RLIMIT_CPU`` bound an execution, and that is logged once)."""
        if self.pid is None:
            return None
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as f:
                stat = f.read()
            # fields after the command name, which the code may rename (it can hold ")")
            fields = stat[stat.rindex(b")") + 2:].split()
            return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime
        except (OSError, ValueError, IndexError, TypeError):
            _warn_once("cpu", "the REPL cannot read its worker's CPU time from /proc: executions are bounded "
                              "by the wall clock (wall_timeout_s) and the worker's CPU rlimit (cpu_s) only")
            return None

    def _cpu_left(self) -> float:
        """CPU seconds this execution has left (all of ``timeout_s`` when the clock is unknown)."""
        start = self._cpu_at_submit
        now = None if start is None else self._cpu_seconds()
        self._left = self.timeout_s - (0.0 if start is None or now is None else now - start)
        return self._left

    def poll(self) -> list[ToolCall] | ReplResult:
        """Wait until the code needs tool results (the unanswered calls) or has finished.

        A synchronous call blocks the code, so it comes back at once; awaitable calls come back
        when the worker reports the calls started in one event-loop turn are all out (calls
        started together under ``asyncio.gather`` come back together), or after ``grace_s``
        without a new call.
        """
        # the CPU clock is read when a wait runs long, and on resuming code that may have run
        # while its awaitable calls were out; not on every message (a tool call's round trip)
        check, self._check_cpu = self._check_cpu, False
        heard = time.monotonic()  # the last message: awaitable calls come back after grace_s of quiet
        while True:
            if any(not c.is_async for c in self._pending.values()):
                self._paused_at = time.monotonic()
                return list(self._pending.values())
            if check and self._cpu_left() <= 0:
                return self._broken("cpu")
            check = False
            now = time.monotonic()
            if now >= self._deadline:  # also for a worker that never stops sending
                return self._broken("wall")
            until = self._deadline if not self._pending else min(self._deadline, heard + self.grace_s)
            # look at the CPU clock again after at most the CPU time left (one thread cannot
            # use more in that wall time), and at least every second (threads can)
            message = self._read(min(until, now + min(1.0, max(0.01, self._left))))
            call = None if message is None else _tool_call(message)
            if call is None and message is not None and message.get("op") == "call":
                self._violate("a malformed tool call")
            if self._violation:
                return self._broken("protocol")
            if message is None:
                if self._eof:
                    return self._broken()
                if self._cpu_left() <= 0:
                    return self._broken("cpu")
                now = time.monotonic()
                if now >= self._deadline:
                    return self._broken("wall")
                if self._pending and now >= until:
                    self._paused_at = now
                    return list(self._pending.values())
                continue
            heard = time.monotonic()
            if call is not None and len(self._pending) >= self.max_pending_calls:  # refused here: no backlog
                self._answer(call.call_id, error=f"more than {self.max_pending_calls} tool calls waiting at once "
                             "(max_pending_calls); await some before starting more")
            elif call is not None:
                self._pending[call.call_id] = call
                self._calls.append(call)
            elif message.get("op") == "waiting" and self._pending:
                self._paused_at = time.monotonic()
                return list(self._pending.values())
            elif message.get("op") == "done":
                return _done(message, self._calls)

    def respond(self, call_id: int, value: Any = None, error: str | None = None) -> None:
        """Answer a tool call (``error``: raised in the code as ``ToolError``). The time the code
        waited for its calls does not count against ``wall_timeout_s``."""
        self._pending.pop(call_id, None)
        if self._paused_at is not None and not self._pending:
            self._check_cpu = any(c.is_async for c in self._calls)
            self._deadline += time.monotonic() - self._paused_at
            self._paused_at = None
        self._answer(call_id, value, error)

    def _answer(self, call_id: int, value: Any = None, error: str | None = None) -> None:
        message = {"op": "result", "id": call_id}
        message.update({"error": error} if error is not None else {"value": value})
        self._write(message)

    def _broken(self, timeout: Literal["cpu", "wall", "protocol"] | None = None) -> ReplResult:
        """Timeout, a dead worker (CPU or memory limit, a crash) or one that broke the protocol
        (its interpreter is the code's): kill, restart, report."""
        died, violation = self._eof, self._violation
        code = self._kill()  # a worker that died by itself keeps the code it died with
        if timeout == "cpu":
            why = f"TimeoutError: the code used more than {self.timeout_s:g} s of CPU time"
        elif timeout == "wall":
            why = f"TimeoutError: the code ran past {self.wall_timeout_s:g} s (wall clock)"
        elif timeout == "protocol":
            why = f"the REPL process sent {violation}, which the trainer does not accept"
        elif died and code is not None and code < 0:
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
