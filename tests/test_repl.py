"""The sandboxed REPL: state persists, tools cross the boundary, and hostile code is contained
with the trainer (this process) still running."""

from __future__ import annotations

import os
import sys

import pytest

from lit_agents.envs.repl import PythonREPL

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox relies on Linux rlimits")


@pytest.fixture(scope="module")
def repl():
    with PythonREPL(tools=["craft"], async_tools=["launch_subagent"], timeout_s=2.0, cpu_s=30, memory_mb=512,
                    max_output_chars=1000) as r:
        yield r


def test_namespace_persists_and_output_is_captured(repl):
    assert repl.run("x = 6 * 7\nprint('hello')").observation() == "hello"
    assert repl.run("print(x)").observation() == "42"
    assert repl.run("1/0").error.rstrip().endswith("ZeroDivisionError: division by zero")


def test_tool_calls_cross_the_boundary(repl):
    seen = []

    def handler(name, args, kwargs):
        seen.append((name, args, kwargs))
        if args == ["bad"]:
            raise ValueError("unknown item bad")
        return {"crafted": args[0], "n": kwargs.get("n", 1)}

    result = repl.run(
        "print(craft('plank', n=4))\ntry:\n    craft('bad')\nexcept ToolError as e:\n    print('error:', e)", handler
    )
    assert seen == [("craft", ["plank"], {"n": 4}), ("craft", ["bad"], {})]
    assert result.observation() == "{'crafted': 'plank', 'n': 4}\nerror: ValueError: unknown item bad"


def test_concurrent_subagents_come_back_together(repl):
    repl.submit("rs = await asyncio.gather(*(launch_subagent(f'goal {i}') for i in range(3)))\nprint(rs)")
    calls = repl.poll()
    assert sorted(c.args[0] for c in calls) == ["goal 0", "goal 1", "goal 2"] and all(c.is_async for c in calls)
    for c in reversed(calls):  # answered in any order
        repl.respond(c.call_id, value=c.args[0].upper())
    assert repl.poll().observation() == "['GOAL 0', 'GOAL 1', 'GOAL 2']"


def test_a_subagent_flood_past_the_depth_limit_gets_errors_not_a_crash(repl):
    def handler(name, args, kwargs):
        raise RuntimeError("depth limit 6 reached: launch_subagent refused")

    code = ("out = []\nfor i in range(200):\n    try:\n        await launch_subagent('x')\n"
            "    except ToolError as e:\n        out.append(str(e))\nprint(len(out), out[0])")
    assert repl.run(code, handler).observation() == "200 RuntimeError: depth limit 6 reached: launch_subagent refused"


FLOOD = ("import asyncio\nasync def go():\n    await asyncio.gather(*[launch_subagent('x') for _ in range(10**4)])\n"
         "asyncio.run(go())")


@pytest.mark.parametrize("bound", [None, 10**6], ids=["max_pending_calls", "unbounded"])
def test_a_flood_of_awaitable_calls_ends_in_a_readable_error_within_the_wall_limit(bound):
    """10^4 calls gathered at once, every one refused by the handler: past ``max_pending_calls``
    the REPL refuses them itself (a ToolError naming the bound); with no practical bound every
    refusal goes back to a worker whose event loop closes under them. Either way the execution
    ends inside the wall limit with the error in the code, and the REPL answers again."""
    import time

    kwargs = {} if bound is None else {"max_pending_calls": bound}
    with PythonREPL(async_tools=["launch_subagent"], wall_timeout_s=10.0, **kwargs) as r:
        started = time.monotonic()
        result = r.run(FLOOD)  # no handler: every call is answered with an error
        assert time.monotonic() - started < 10.0
        expected = "more than 64 tool calls waiting at once" if bound is None else "no handler for tool"
        assert "ToolError" in result.observation() and expected in result.observation(), result.observation()
        assert r.run("print(6*7)").observation() == "42"


def test_a_worker_that_stops_reading_cannot_stall_the_trainer():
    """The code owns the worker's interpreter: here it stops the worker reading its command pipe,
    then starts more calls than the pipe holds answers for. The trainer never blocks writing to
    the worker: the wall clock ends the execution, and a fresh worker answers."""
    import time

    code = ("import sys, time, asyncio\nsys.modules['__main__']._resolve = lambda m: time.sleep(10**6)\n"
            "async def go():\n    await asyncio.gather(*[launch_subagent('x') for _ in range(5000)])\n"
            "asyncio.run(go())")
    with PythonREPL(async_tools=["launch_subagent"], wall_timeout_s=2.0, max_pending_calls=10**6) as r:
        started = time.monotonic()
        result = r.run(code, lambda name, args, kwargs: "y" * 200)  # ~1 MB of answers, the pipe holds 64 kB
        assert time.monotonic() - started < 10.0
        assert "ran past 2 s (wall clock)" in result.observation() and result.restarted, result.observation()
        assert r.run("print(6*7)").observation() == "42"


SEND = "import sys\nsend = sys.modules['__main__']._send\n"
BROKEN = {
    "not an object": (SEND + "send([1, 2])", "a message that is not a JSON object"),
    "malformed call": (SEND + "send({'op': 'call', 'id': 'x', 'name': 1})", "a malformed tool call"),
    "endless line": ("import sys\np = sys.modules['__main__'].PROTOCOL\np.write('x' * (9 << 20))\np.flush()\n"
                     "import time\ntime.sleep(5)", "a message over"),
    "endless messages": (SEND + "while True:\n    send({'op': 'noise'})", "ran past 2 s (wall clock)"),
}


@pytest.mark.parametrize("case", list(BROKEN), ids=list(BROKEN))
def test_a_worker_that_breaks_the_protocol_is_replaced(case):
    """Nothing the worker sends is trusted: a message of the wrong shape ends the worker with a
    message saying so, a worker that never stops sending still meets the wall clock, and a fresh
    worker answers."""
    code, expected = BROKEN[case]
    with PythonREPL(async_tools=["launch_subagent"], timeout_s=30.0, wall_timeout_s=2.0) as r:
        result = r.run(code)
        assert expected in result.observation() and result.restarted, result.observation()
        assert r.run("print(6*7)").observation() == "42"


HOSTILE = {
    "infinite loop": ("while True:\n    pass", "TimeoutError"),
    "fork bomb": ("import os\nwhile True:\n    os.fork()", "os.fork is not allowed"),
    "multiprocessing": ("import multiprocessing", "not allowed"),
    "subprocess": ("import subprocess\nsubprocess.run(['ls', '/'])", "subprocess.Popen is not allowed"),
    "shell": ("import os\nos.system('touch /tmp/pwned')", "os.system is not allowed"),
    "memory bomb": ("x = bytearray(4 * 1024 ** 3)", "MemoryError"),
    "huge output": ("print('y' * 10 ** 7)", "[output truncated]"),
    "write outside": ("open('/tmp/lit_agents_pwned.txt', 'w').write('x')", "is not allowed"),
    "read trainer files": (f"print(open({os.path.abspath(__file__)!r}).read())", "is not allowed"),
    "list trainer dir": (f"import os\nprint(os.listdir({os.getcwd()!r}))", "is not allowed"),
    "trainer environment": (f"print(open('/proc/{os.getpid()}/environ').read())", "is not allowed"),
    "socket": ("import socket\nsocket.create_connection(('127.0.0.1', 22))", "is not allowed"),
    "kill parent": ("import os\nos.kill(os.getppid(), 9)", "os.kill is not allowed"),
    "kill group": ("import os\nos.killpg(0, 9)", "os.killpg is not allowed"),
    "ctypes crash": ("import ctypes\nctypes.string_at(0)", "importing ctypes is not allowed"),
    "raise limits": ("import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))", "not allowed"),
    "recursion bomb": ("def f(n):\n    return f(n + 1)\nf(0)", "RecursionError"),
    "exit": ("exit()", "NameError"),
    "close the pipe": ("import sys\nsys.stdin.close()\nprint('closed a dummy')", "closed a dummy"),
}


@pytest.mark.parametrize("case", list(HOSTILE), ids=list(HOSTILE))
def test_hostile_code_is_contained(repl, case):
    code, expected = HOSTILE[case]
    result = repl.run(code)
    assert expected in result.observation(), result.observation()
    assert repl.run("print('alive')").observation() == "alive"  # the REPL answers again
    assert not os.path.exists("/tmp/pwned") and not os.path.exists("/tmp/lit_agents_pwned.txt")


def test_a_crash_restarts_the_worker_and_says_so():
    with PythonREPL(timeout_s=5.0) as r:
        r.run("x = 1")
        result = r.run("import sys\nsys.setrecursionlimit(10 ** 7)\ndef f(n):\n    return f(n + 1)\nf(0)")
        assert "not allowed" in result.observation() or result.restarted
        dead = r.run("import os\nos.abort()")
        assert dead.restarted and "restarted" in dead.observation()
        assert "NameError" in r.run("print(x)").observation()  # a fresh namespace


@pytest.mark.parametrize("spawn", ["zygote", "exec"])
def test_a_limit_breach_names_the_signal_and_either_start_works(spawn):
    """The exit code of a worker that died by itself reaches the driver, whether the worker was
    forked from the zygote or started as a fresh interpreter."""
    with PythonREPL(timeout_s=30.0, cpu_s=1, spawn=spawn) as r:
        assert r.run("x = 6 * 7\nprint(x)").observation() == "42"
        result = r.run("while True:\n    pass")
        assert result.restarted and "killed by SIG" in result.observation(), (
            result.observation()
        )  # SIGKILL: soft = hard
        assert r.run("print('alive')").observation() == "alive"


def test_workers_are_forked_from_one_zygote_per_trainer_process():
    from lit_agents.envs import repl as module

    with PythonREPL() as a, PythonREPL() as b:
        zygote = module._zygote.proc.pid
        assert a.run("import os\nprint(os.getppid())").observation() == str(zygote)
        assert b.run("import os\nprint(os.getppid())").observation() == str(zygote)
        assert a.pid != b.pid


def test_close_removes_the_work_directory():
    r = PythonREPL()
    r.run("open('f.txt', 'w').write('hi')")
    folder = r.workdir
    assert os.path.exists(os.path.join(folder, "f.txt"))
    r.close()
    assert not os.path.exists(folder)


def test_time_waiting_for_tools_does_not_count():
    import time

    with PythonREPL(async_tools=["launch_subagent"], timeout_s=1.0, wall_timeout_s=1.0) as r:
        r.submit("print(await launch_subagent('slow child'))")
        (call,) = r.poll()
        time.sleep(1.5)  # the driver plays the child for longer than the code's own limit
        r.respond(call.call_id, value="child done")
        assert r.poll().observation() == "child done"


def test_the_time_limit_counts_cpu_seconds_not_a_loaded_machine():
    """A worker kept off the CPU for longer than its limit (a loaded machine; here SIGSTOP) still
    finishes its code: the limit is the worker's CPU time. Code that sleeps uses none and meets
    the wall-clock backstop instead; threads' CPU time counts."""
    import signal
    import time

    with PythonREPL(timeout_s=1.0, wall_timeout_s=20.0) as r:
        r.submit("x = sum(range(10 ** 6))\nprint('done', x)")
        os.kill(r.pid, signal.SIGSTOP)
        time.sleep(1.5)
        os.kill(r.pid, signal.SIGCONT)
        assert r.poll().observation() == "done 499999500000"
        assert r.run("import time\ntime.sleep(1.5)\nprint('slept')").observation() == "slept"
        started = time.monotonic()
        busy = r.run("import threading, time\ndef burn():\n    while True:\n        pass\n"
                     "for _ in range(2):\n    threading.Thread(target=burn, daemon=True).start()\ntime.sleep(60)")
        assert "TimeoutError: the code used more than 1 s of CPU time" in busy.observation(), busy.observation()
        assert busy.restarted and time.monotonic() - started < 10
    with PythonREPL(timeout_s=1.0, wall_timeout_s=1.0) as r:
        slept = r.run("import time\ntime.sleep(30)")
        assert "TimeoutError: the code ran past 1 s (wall clock)" in slept.observation(), slept.observation()
        assert r.run("print('alive')").observation() == "alive"


def test_cpu_burned_while_tool_calls_are_out_counts():
    """Code that leaves a subagent call pending and spins meanwhile is charged for the CPU it
    used while the driver played the child (the wall clock pauses there, the CPU clock not)."""
    import time

    with PythonREPL(async_tools=["launch_subagent"], timeout_s=1.0, wall_timeout_s=30.0) as r:
        r.submit("task = asyncio.ensure_future(launch_subagent('child'))\nawait asyncio.sleep(0)\n"
                 "while True:\n    pass")
        (call,) = r.poll()
        start = r._cpu_seconds()
        while r._cpu_seconds() - start < 1.2:  # the code spins for 1.2 CPU seconds, however loaded the machine
            time.sleep(0.05)
        r.respond(call.call_id, value="child done")
        started = time.monotonic()
        result = r.poll()
        assert "TimeoutError: the code used more than 1 s of CPU time" in result.observation(), result.observation()
        assert time.monotonic() - started < 1.0


def test_awaitable_calls_come_back_after_grace_even_when_the_cpu_clock_is_read_sooner():
    """A call the code leaves out while it keeps busy without CPU (here a sleep, so the event
    loop never idles to say it waits) comes back after ``grace_s`` of quiet, although the CPU
    clock is read more often than that (``timeout_s`` < ``grace_s``)."""
    import time

    with PythonREPL(async_tools=["launch_subagent"], timeout_s=0.3, wall_timeout_s=30.0, grace_s=0.5) as r:
        r.submit("import time\ntask = asyncio.ensure_future(launch_subagent('child'))\nawait asyncio.sleep(0)\n"
                 "time.sleep(4)\nprint(await task)")
        started = time.monotonic()
        (call,) = r.poll()
        assert time.monotonic() - started < 3.0  # grace_s after the call, not the 4-s sleep
        r.respond(call.call_id, value="child done")
        assert r.poll().observation() == "child done"


def test_without_the_cpu_clock_the_wall_clock_still_bounds_an_execution(monkeypatch):
    """Where /proc does not give the worker's CPU time, the wall-clock backstop stops a busy loop."""
    monkeypatch.setattr(PythonREPL, "_cpu_seconds", lambda self: None)
    with PythonREPL(timeout_s=1.0, wall_timeout_s=1.0) as r:
        result = r.run("while True:\n    pass")
        assert "TimeoutError: the code ran past 1 s (wall clock)" in result.observation(), result.observation()


def test_a_worker_ends_when_its_trainer_dies_mid_tool_call():
    """A trainer killed while the code awaits a subagent leaves no worker behind: the worker
    sees its command pipe close and exits instead of waiting forever."""
    import subprocess
    import time

    script = (
        "import os\nfrom lit_agents.envs.repl import PythonREPL\n"
        "r = PythonREPL(async_tools=['launch_subagent'])\n"
        "r.submit(\"print(await launch_subagent('child'))\")\nr.poll()\n"
        "from lit_agents.envs import repl\n"
        "print(r.pid, repl._zygote.proc.pid, flush=True)\nos._exit(1)  # as if killed: nothing closed\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)

    def running(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited, not yet reaped
        except FileNotFoundError:
            return False

    for pid, what in zip(map(int, out.stdout.split()[-2:]), ("REPL worker", "REPL zygote")):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and running(pid):
            time.sleep(0.1)
        assert not running(pid), f"the orphaned {what} is still running"
