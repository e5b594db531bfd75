"""The sandboxed side of `lit_agents.envs.repl`: runs model code in its own process.

Started as ``python -I -u _repl_worker.py <workdir> <limits json>`` with a cleaned environment.
It never imports ``lit_agents`` (nothing of the trainer is loaded here). Before any model code runs
it applies resource limits (CPU seconds, address space, file size, open files, no core dumps),
moves into its own session and working directory, and installs an audit hook (which cannot be
removed from Python) that refuses: processes (fork, exec, spawn, system, subprocess), signals
(kill, killpg, pthread_kill), sockets, ctypes and other native-code loading, opening files
outside the work directory (reads are also allowed under the Python installation, for imports),
and listing or changing into directories outside it.

Protocol: one JSON object per line. In (stdin): ``{"op": "exec", "code"}``, ``{"op": "result",
"id", "value"}`` / ``{"op": "result", "id", "error"}``. Out (the real stdout, kept private):
``{"op": "call", "id", "name", "args", "kwargs", "async"}`` for a tool call, ``{"op": "waiting"}``
once the awaitable calls started in one event-loop turn have all been sent, ``{"op": "done",
"output", "error", "truncated"}`` when an execution ends. Tool functions are stubs that send a
call and wait for its result; ``async`` tools (``launch_subagent``) return awaitables, so code can
run several at once with ``asyncio.gather`` (top-level ``await`` is allowed).

Started as ``python -I -S -u _repl_worker.py --zygote <fd>`` instead, it is a zygote: it loads
this module once, applies nothing, and forks one worker per request that arrives on the Unix
socket ``fd`` (``{"op": "spawn", "workdir", "limits"}`` with the worker's command and protocol
pipes attached as file descriptors; answered ``{"pid"}``), or ends one (``{"op": "end", "pid"}``:
killed, reaped, answered ``{"status"}``, the exit code, negative for a signal). A forked worker
then sets itself up exactly as a started one does, in a few milliseconds instead of an
interpreter start. The zygote exits when the socket closes (its trainer ended).
"""

import ast
import asyncio
import io
import itertools
import json
import os
import resource
import sys
import threading
import traceback

WORKDIR, LIMITS, PROTOCOL, COMMANDS = "", {}, None, None  # set by `_serve`
_send_lock = threading.Lock()


def _send(message):
    with _send_lock:
        PROTOCOL.write(json.dumps(message) + "\n")
        PROTOCOL.flush()


# ------------------------------------------------------------------ limits
def _limit(kind, value):
    try:
        resource.setrlimit(kind, (value, value))
    except (ValueError, OSError):
        pass


_READ_ROOTS = tuple({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)})
_BLOCKED_EVENTS = (
    "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen",
    "os.kill", "os.killpg", "signal.pthread_kill", "os.startfile", "ctypes.", "socket.", "os.setuid",
    "os.chroot", "sys.setrecursionlimit", "os.putenv", "os.unsetenv", "_posixsubprocess",
    "mmap.__new__", "pty.spawn", "os.truncate", "shutil.rmtree", "resource.setrlimit", "resource.prlimit",
    "sys._current_frames", "sys.settrace", "sys.setprofile", "gc.get_referrers", "gc.get_objects",
    "code.__new__", "function.__new__",
)
_NATIVE_MODULES = ("ctypes", "_ctypes", "cffi", "_posixsubprocess", "socket", "_socket", "subprocess",
                   "multiprocessing", "_multiprocessing", "mmap", "resource", "pty", "fcntl", "signal", "_signal")


def _inside(path, roots):
    try:
        real = os.path.realpath(os.fsdecode(path)) if not isinstance(path, int) else None
    except (TypeError, ValueError):
        return False
    if real is None:  # an already-open descriptor
        return True
    return any(real == r or real.startswith(r + os.sep) for r in roots)


def _audit(event, args):
    if event.startswith(_BLOCKED_EVENTS):
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "import" and args and str(args[0]).split(".")[0] in _NATIVE_MODULES:
        raise PermissionError(f"sandbox: importing {args[0]} is not allowed")
    if event == "open":
        path, mode = args[0], args[1] if len(args) > 1 else "r"
        flags = args[2] if len(args) > 2 else 0
        writing = (mode is not None and any(c in str(mode) for c in "wax+")) or (
            isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))
        roots = (WORKDIR,) if writing else (WORKDIR, *_READ_ROOTS)
        if path is not None and not _inside(path, roots):
            raise PermissionError(f"sandbox: opening {path!r} is not allowed (work directory: {WORKDIR})")
    if event in ("os.listdir", "os.scandir", "os.chdir", "os.remove", "os.rename", "os.rmdir", "os.mkdir",
                 "os.symlink", "os.link", "os.chmod", "os.chown", "os.utime"):
        path = args[0] if args else "."
        if path is not None and not _inside(path if path != "" else ".", (WORKDIR,)):
            raise PermissionError(f"sandbox: {event} on {path!r} is not allowed")


# ------------------------------------------------------------------ tool stubs
_ids = itertools.count()
_waiting = {}  # call id -> (threading.Event, slot) for sync calls
_futures = {}  # call id -> (loop, future) for async calls


class ToolError(Exception):
    """An error the environment or agent loop returned for a tool call."""


def _sync_tool(name):
    def call(*args, **kwargs):
        cid = next(_ids)
        done, slot = threading.Event(), {}
        _waiting[cid] = (done, slot)
        _send({"op": "call", "id": cid, "name": name, "args": list(args), "kwargs": kwargs, "async": False})
        done.wait()
        if "error" in slot:
            raise ToolError(slot["error"])
        return slot.get("value")

    call.__name__ = name
    return call


_flush_scheduled = [False]


def _flush():
    _flush_scheduled[0] = False
    _send({"op": "waiting"})


def _async_tool(name):
    async def call(*args, **kwargs):
        cid = next(_ids)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        _futures[cid] = (loop, future)
        _send({"op": "call", "id": cid, "name": name, "args": list(args), "kwargs": kwargs, "async": True})
        if not _flush_scheduled[0]:  # after the calls started in this loop turn (asyncio.gather): "waiting"
            _flush_scheduled[0] = True
            loop.call_soon(_flush)
        return await future

    call.__name__ = name
    return call


def _resolve(message):
    cid = message["id"]
    if cid in _waiting:
        done, slot = _waiting.pop(cid)
        slot.update({k: message[k] for k in ("value", "error") if k in message})
        done.set()
    elif cid in _futures:
        loop, future = _futures.pop(cid)

        def settle():
            if future.done():
                return
            if "error" in message:
                future.set_exception(ToolError(message["error"]))
            else:
                future.set_result(message.get("value"))

        loop.call_soon_threadsafe(settle)


# ------------------------------------------------------------------ execution
class _CappedOutput(io.TextIOBase):
    def __init__(self, cap):
        self.cap, self.parts, self.size, self.truncated = cap, [], 0, False

    def write(self, text):
        room = self.cap - self.size
        if room > 0:
            self.parts.append(text[:room])
            self.size += min(len(text), room)
        if len(text) > max(room, 0):
            self.truncated = True
        return len(text)

    def getvalue(self):
        return "".join(self.parts)


def _execute(code):
    out = _CappedOutput(int(LIMITS["max_output_chars"]))
    sys.stdout = sys.stderr = out
    error = None
    try:
        tree = compile(code, "<repl>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
        result = eval(tree, namespace)  # noqa: S307 - this process is the sandbox
        if asyncio.iscoroutine(result):
            LOOP.run_until_complete(result)
    except BaseException as err:  # everything comes back as an observation
        if isinstance(err, SystemExit):
            error = "SystemExit: exit() is not available in the REPL"
        else:
            frames = traceback.format_exception(type(err), err, err.__traceback__)
            error = "".join(f for f in frames if "_repl_worker.py" not in f)[-2000:]
    finally:
        sys.stdout = sys.stderr = io.StringIO()
    _send({"op": "done", "output": out.getvalue(), "error": error, "truncated": out.truncated})


def _reader(jobs):
    for line in COMMANDS:
        message = json.loads(line)
        if message["op"] == "result":
            _resolve(message)
        elif message["op"] == "exec":
            jobs.append(message["code"])
            jobs_ready.set()
    # the command pipe closed: the trainer closed this REPL or died, maybe while code here
    # awaits a tool result that will never come; end now rather than wait forever
    os._exit(0)


def _serve(workdir, limits, commands, protocol):
    """Become a sandboxed worker: limits, namespace, audit hook, then execute until the command
    pipe closes."""
    global WORKDIR, LIMITS, PROTOCOL, COMMANDS, LOOP, namespace, jobs_ready
    WORKDIR, LIMITS, PROTOCOL, COMMANDS = os.path.realpath(workdir), limits, protocol, commands
    sys.stdout = sys.stderr = io.StringIO()  # nothing but the protocol reaches the real stdout
    sys.stdin = io.StringIO()  # the code cannot read (or close) the command pipe
    _limit(resource.RLIMIT_CPU, int(LIMITS["cpu_s"]))
    _limit(resource.RLIMIT_AS, int(LIMITS["memory_mb"]) * 1024 * 1024)
    _limit(resource.RLIMIT_FSIZE, int(LIMITS["file_mb"]) * 1024 * 1024)
    _limit(resource.RLIMIT_CORE, 0)
    _limit(resource.RLIMIT_NOFILE, 64)
    try:
        os.setsid()
    except OSError:
        pass
    os.chdir(WORKDIR)
    sys.setrecursionlimit(min(sys.getrecursionlimit(), 2000))

    builtins = dict(vars(__builtins__)) if isinstance(__builtins__, type(sys)) else dict(__builtins__)
    for name in ("exit", "quit", "breakpoint", "help", "input"):
        builtins.pop(name, None)
    namespace = {"__name__": "__repl__", "__builtins__": builtins, "asyncio": asyncio, "ToolError": ToolError}
    for tool in LIMITS["tools"]:
        namespace[tool] = _sync_tool(tool)
    for tool in LIMITS["async_tools"]:
        namespace[tool] = _async_tool(tool)

    LOOP = asyncio.new_event_loop()  # made before the hook: a loop needs a socket pair
    asyncio.set_event_loop(LOOP)
    sys.addaudithook(_audit)
    jobs, jobs_ready = [], threading.Event()
    threading.Thread(target=_reader, args=(jobs,), daemon=True).start()
    _send({"op": "ready"})
    while True:
        jobs_ready.wait()
        jobs_ready.clear()
        while jobs:
            _execute(jobs.pop(0))


def _end(pid):
    """Kill a forked worker (its session: it is the leader once set up) and reap it."""
    import signal

    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    except ChildProcessError:
        return None


def _zygote(fd):
    """Fork workers on request (see the module docstring) until the control socket closes."""
    import socket

    control = socket.socket(fileno=fd)
    buffer, fds = b"", []
    while True:
        data, received, _, _ = socket.recv_fds(control, 1 << 16, 2)
        if not data:  # the trainer is gone; its workers end when their command pipes close
            os._exit(0)
        buffer, fds = buffer + data, fds + received
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            request = json.loads(line)
            if request["op"] == "end":
                reply = {"status": _end(request["pid"])}
            else:
                (commands, protocol), fds = fds[:2], fds[2:]
                pid = os.fork()
                if pid == 0:  # the worker: nothing of the zygote's is left open
                    try:
                        control.close()
                        os.dup2(commands, 0)
                        os.dup2(protocol, 1)
                        os.closerange(3, 1 << 16)
                        if "random" in sys.modules:
                            sys.modules["random"].seed()
                        _serve(request["workdir"], request["limits"], open(0, encoding="utf-8"),  # noqa: SIM115
                               open(1, "w", encoding="utf-8"))  # noqa: SIM115
                    finally:
                        os._exit(1)
                os.close(commands)
                os.close(protocol)
                reply = {"pid": pid}
            control.sendall((json.dumps(reply) + "\n").encode())


if __name__ == "__main__":
    if sys.argv[1] == "--zygote":
        _zygote(int(sys.argv[2]))
    else:
        _serve(sys.argv[1], json.loads(sys.argv[2]), sys.stdin, sys.stdout)
