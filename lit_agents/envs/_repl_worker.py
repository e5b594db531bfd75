"""The sandboxed side of `lit_agents.envs.repl`: runs model code in its own process.

Started as ``python -I -u _repl_worker.py <workdir> <limits json>`` with a cleaned environment.
It never imports ``lit_agents`` (nothing of the trainer is loaded here). Before any model code runs
it applies resource limits (CPU seconds, address space, file size, open files, no core dumps),
moves into its own session and working directory, confines itself by the kernel (`_contain`:
identity, ``no_new_privs``, Landlock, seccomp; docs/sandbox.md; limits ``containment``
``"python-only"`` skips it, and a missing layer is answered ``{"op": "refused", "layer",
"error"}`` instead of ``ready``), and installs an audit hook that refuses, with a clear message:
processes (fork, exec, spawn, system, subprocess), signals (kill, killpg, pthread_kill), sockets
but Unix ones, ctypes and other native-code loading, opening files outside the work directory
(reads are also allowed under the Python installation, for imports), and listing or changing
into directories outside it. The model's code can switch the hook off (it owns this
interpreter); the kernel layers are the containment.

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
    if event == "socket.__new__" and len(args) > 1 and args[1] == 1:  # AF_UNIX: asyncio's self-pipe
        return
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


# ------------------------------------------------------------------ kernel containment
# (see docs/sandbox.md). Everything here runs in the worker before any model code, while it is
# still single-threaded: seccomp filters and Landlock domains bind the calling thread and the
# threads it creates later.
_SANDBOX_ID = 65534  # nobody / nogroup: the worker's uid and gid when the trainer runs as root
_LANDLOCK_MIN_ABI = 3  # 3: truncate is controlled too
_PR_SET_DUMPABLE, _PR_SET_KEEPCAPS, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS = 4, 8, 24, 38
_NR_LANDLOCK = (444, 445, 446)  # create_ruleset, add_rule, restrict_self (one number on every arch)
_FS_READ = (1 << 2) | (1 << 3)  # READ_FILE | READ_DIR
_FS_FILE_RIGHTS = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 14) | (1 << 15)  # the rights a file rule may hold
_FS_ALL_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}  # 5+: (1 << 16) - 1
_READ_PATHS = ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/lib32", "/etc/ld.so.cache", "/etc/localtime",
               "/usr/share/zoneinfo", "/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")
_libc = ctypes = None  # ctypes: loaded by `_c`, kept out of sys.modules (see `_hide_ctypes`)


class _LayerMissing(Exception):
    """A containment layer this machine cannot provide: ``layer`` and why."""

    def __init__(self, layer, why):
        super().__init__(f"{layer}: {why}")
        self.layer = layer


def _c():
    """libc through ctypes, with errno (loaded in the zygote once, before the fork)."""
    global _libc, ctypes
    if _libc is None:
        import ctypes as module

        ctypes, _libc = module, module.CDLL(None, use_errno=True)
        _hide_ctypes()
    return _libc


def _hide_ctypes():
    """Out of sys.modules again: the model's ``import ctypes`` is then a real import, which the
    audit hook answers with its clear message (a cached module raises no import event)."""
    for name in [m for m in sys.modules if m.split(".")[0] in ("ctypes", "_ctypes")]:
        del sys.modules[name]


def _check(result, what):
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _prctl(option, arg=0):
    return _check(_c().prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)),
                  f"prctl({option})")


def _capset(bits):
    """Set the permitted and effective capabilities to ``bits`` (inheritable: none)."""
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)(bits & 0xFFFFFFFF, bits & 0xFFFFFFFF, 0, bits >> 32, bits >> 32, 0)
    _check(_c().capset(header, data), "capset")


def _drop_identity():
    """As root: become uid/gid ``_SANDBOX_ID`` with no groups and no capabilities, so the kernel's
    own permission checks (signals, ptrace, /proc of other processes) treat the worker as
    nobody. The filesystem uid stays 0 (without any capability: only owner permission bits
    count) so that an interpreter installed where only root can traverse (pyenv under /root)
    still imports; Landlock decides what it may open. Returns the layer's description."""
    for cap in range(64):  # the bounding set: no capability can come back through exec
        try:
            _prctl(_PR_CAPBSET_DROP, cap)
        except OSError:
            break  # past the last capability this kernel knows, or not allowed (not root)
    if os.getuid() != 0:
        _capset(0)  # a non-root trainer may still hold some (a container's): none here
        return "the trainer's uid (not root), no capabilities; Landlock and seccomp contain it"
    os.setgroups([])
    os.setresgid(_SANDBOX_ID, _SANDBOX_ID, _SANDBOX_ID)
    _prctl(_PR_SET_KEEPCAPS, 1)
    os.setresuid(_SANDBOX_ID, _SANDBOX_ID, _SANDBOX_ID)
    _capset(1 << 7)  # CAP_SETUID only, for the next call
    _c().setfsuid(0)
    _capset(0)
    _prctl(_PR_SET_KEEPCAPS, 0)
    if _c().setfsuid(-1) != 0 or os.getresuid() != (_SANDBOX_ID,) * 3:
        raise _LayerMissing("identity", "the uid change did not hold")
    return f"uid/gid {_SANDBOX_ID}, no groups, no capabilities (filesystem uid 0, owner bits only)"


def _landlock(workdir):
    """Landlock: read-only under the interpreter and the system libraries, everything in the work
    directory, nothing else; no TCP bind/connect (ABI 4+); no signals to or abstract Unix
    sockets of processes outside this worker (ABI 6+)."""
    libc = _c()
    abi = libc.syscall(_NR_LANDLOCK[0], None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < _LANDLOCK_MIN_ABI:
        why = (
            "not supported by this kernel" if abi < 0 else f"ABI {abi} < {_LANDLOCK_MIN_ABI} (truncate not controlled)"
        )
        raise _LayerMissing("filesystem (Landlock)", why)
    handled_fs = _FS_ALL_BY_ABI.get(abi, (1 << 16) - 1)
    handled_net = 3 if abi >= 4 else 0
    scoped = 3 if abi >= 6 else 0
    attr = (ctypes.c_uint64 * 3)(handled_fs, handled_net, scoped)
    size = 24 if abi >= 6 else (16 if abi >= 4 else 8)
    ruleset = _check(libc.syscall(_NR_LANDLOCK[0], attr, ctypes.c_size_t(size), ctypes.c_uint32(0)),
                     "landlock_create_ruleset")
    try:
        worker = os.path.realpath(__file__)
        rules = [(p, _FS_READ) for p in (*_READ_ROOTS, *_READ_PATHS, worker, f"/proc/{os.getpid()}")]
        rules.append((WORKDIR, handled_fs))
        for path, access in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # not on this machine
            try:
                if not os.path.isdir(path):
                    access &= _FS_FILE_RIGHTS
                rule = ctypes.create_string_buffer(access.to_bytes(8, sys.byteorder) + fd.to_bytes(4, sys.byteorder,
                                                                                                   signed=True))
                _check(libc.syscall(_NR_LANDLOCK[1], ruleset, 1, rule, ctypes.c_uint32(0)), f"landlock_add_rule {path}")
            finally:
                os.close(fd)
        _check(libc.syscall(_NR_LANDLOCK[2], ruleset, ctypes.c_uint32(0)), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return f"Landlock ABI {abi}: read-only interpreter and libraries, read-write work directory" + (
        ", no TCP" if handled_net else "") + (", scoped signals and abstract sockets" if scoped else "")


# syscalls refused outright with EPERM: new processes, programs, other processes, namespaces,
# mounts, kernel objects, and raising limits
_SECCOMP_DENY = (
    "fork", "vfork", "execve", "execveat", "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
    "pidfd_open", "pidfd_getfd", "pidfd_send_signal", "tkill", "setrlimit", "mount", "umount2", "pivot_root",
    "chroot", "unshare", "setns", "mount_setattr", "fsopen", "fsmount", "fsconfig", "fspick", "move_mount",
    "open_tree", "bpf", "keyctl", "add_key", "request_key", "perf_event_open", "userfaultfd", "io_uring_setup",
    "io_uring_enter", "io_uring_register", "open_by_handle_at", "name_to_handle_at", "kexec_load",
    "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot", "swapon", "swapoff", "acct",
    "syslog", "quotactl", "personality", "iopl", "ioperm", "modify_ldt", "uselib", "settimeofday",
    "clock_settime", "clock_adjtime", "adjtimex", "sethostname", "setdomainname", "vhangup", "capset",
    "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setfsuid", "setfsgid", "setgroups",
    "socket", "connect", "bind", "listen", "accept", "accept4", "lookup_dcookie", "fanotify_init",
)
_SCMP_ACT_ALLOW, _SCMP_CMP_NE, _SCMP_CMP_EQ, _SCMP_CMP_MASKED_EQ = 0x7FFF0000, 1, 4, 7
_EPERM, _ENOSYS, _CLONE_THREAD, _AF_UNIX, _SOCK_STREAM = 1, 38, 0x00010000, 1, 1
_seccomp = _Cmp = None
_syscall_numbers = {}  # name -> number on this architecture (resolved once, in the zygote)


def _seccomp_lib():
    global _seccomp, _Cmp
    if _seccomp is None:
        _c()
        for name in ("libseccomp.so.2", "libseccomp.so"):
            try:
                _seccomp = ctypes.CDLL(name, use_errno=True)
                break
            except OSError:
                continue
        else:
            raise _LayerMissing("processes (seccomp)", "libseccomp.so.2 is not installed (apt-get install libseccomp2)")
        _seccomp.seccomp_init.restype = ctypes.c_void_p
        _seccomp.seccomp_init.argtypes = [ctypes.c_uint32]
        _seccomp.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                                    ctypes.c_void_p]
        _seccomp.seccomp_load.argtypes = _seccomp.seccomp_release.argtypes = [ctypes.c_void_p]
        _seccomp.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]

        class _Cmp(ctypes.Structure):  # struct scmp_arg_cmp
            _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("a", ctypes.c_uint64), ("b", ctypes.c_uint64)]

        for name in (*_SECCOMP_DENY, "clone3", "clone", "kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo",
                     "prlimit64", "socketpair"):
            _syscall_numbers[name] = _seccomp.seccomp_syscall_resolve_name(name.encode())
    return _seccomp


def _seccomp_filter():
    """seccomp (through libseccomp): refuse with EPERM, so the code gets a PermissionError and the
    worker lives on, every syscall in `_SECCOMP_DENY`; clone without CLONE_THREAD (threads still
    work); clone3 (ENOSYS: glibc falls back to clone); signals to any process but this one; new
    limits through prlimit64; socketpair but for a Unix stream pair (asyncio's self-pipe)."""
    lib = _seccomp_lib()
    ctx = lib.seccomp_init(_SCMP_ACT_ALLOW)
    if not ctx:
        raise _LayerMissing("processes (seccomp)", "seccomp_init failed")
    eperm, pid = 0x00050000 | _EPERM, os.getpid()

    def rule(name, action, *cmps):
        nr = _syscall_numbers[name]
        if nr < 0:
            return  # not a syscall on this architecture
        array = (_Cmp * max(len(cmps), 1))(*(_Cmp(*c) for c in cmps))
        if lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), array) < 0:
            raise _LayerMissing("processes (seccomp)", f"cannot add the rule for {name}")

    try:
        for name in _SECCOMP_DENY:
            rule(name, eperm)
        rule("clone3", 0x00050000 | _ENOSYS)
        rule("clone", eperm, (0, _SCMP_CMP_MASKED_EQ, _CLONE_THREAD, 0))
        for name in ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
            rule(name, eperm, (0, _SCMP_CMP_NE, pid, 0))
        rule("prlimit64", eperm, (2, _SCMP_CMP_NE, 0, 0))
        rule("socketpair", eperm, (0, _SCMP_CMP_NE, _AF_UNIX, 0))
        for kind in range(16):
            if kind != _SOCK_STREAM:
                rule("socketpair", eperm, (1, _SCMP_CMP_MASKED_EQ, 0xF, kind))
        if lib.seccomp_load(ctypes.c_void_p(ctx)) < 0:
            raise _LayerMissing("processes (seccomp)", "seccomp_load failed (seccomp filters not supported?)")
    finally:
        lib.seccomp_release(ctypes.c_void_p(ctx))
    return "seccomp: no fork, exec, ptrace, namespaces, mounts, sockets (Unix socketpair only), raising limits; " \
           "signals only to itself"


def _contain():
    """Apply every kernel layer, in an order where each step still has the rights it needs.
    Returns {layer: description}; raises `_LayerMissing` naming the first layer this machine
    lacks. ``LIMITS["layers_under_test"]`` (only the sandbox's own tests set it, by writing the
    REPL's private limits) applies just the layers it names, so that each layer is shown to hold
    on its own; the result then names exactly those."""
    only = LIMITS.get("layers_under_test")
    layers = {}
    try:
        _c()
        _seccomp_lib()
        if only is None or "identity" in only:
            layers["identity"] = _drop_identity()
        _prctl(_PR_SET_NO_NEW_PRIVS, 1)
        _prctl(_PR_SET_DUMPABLE, 0)
        if only is None or "filesystem" in only:
            layers["filesystem"] = _landlock(WORKDIR)
        if only is None or "processes" in only:
            layers["processes"] = _seccomp_filter()
    except OSError as err:
        raise _LayerMissing("setup", str(err)) from None
    if only is None:
        layers["network"] = "no sockets but a Unix socketpair (seccomp), no TCP (Landlock)"
    return layers


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

        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the code's event loop has closed (asyncio.run ended): nobody awaits it
            pass


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
    layers = {}
    if LIMITS.get("containment", "kernel") == "kernel":
        try:
            if LIMITS.get("simulate_missing"):  # for tests of the refusal
                raise _LayerMissing(LIMITS["simulate_missing"], "simulated")
            layers = _contain()
        except _LayerMissing as err:  # never run model code with less than was asked for
            _send({"op": "refused", "layer": err.layer, "error": str(err)})
            os._exit(3)
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
    _send({"op": "ready", "layers": layers})
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
    try:  # loaded once here, so that a forked worker only applies them
        _c()
        _seccomp_lib()
    except (_LayerMissing, OSError):
        pass  # each worker finds (and reports) the missing layer itself
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
