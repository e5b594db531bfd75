"""The REPL's kernel sandbox holds when the model's code owns the worker's interpreter.

Every case first switches off every Python-level check of `_repl_worker.py` (the audit hook's
tables, its work directory and read roots, and the hook function itself, through its
``__code__``), shows the hook is really off (imports the hook refuses now pass), then tries ONE
escape. The kernel must refuse it, the REPL must answer with text, and the trainer (this
process) must live on. See docs/sandbox.md.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import struct
import subprocess
import sys
import textwrap
import uuid

import pytest

from lit_agents.envs.repl import PythonREPL, SandboxUnavailable

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the kernel sandbox is Linux's (Landlock, seccomp)")

# what code owning the interpreter does first: every Python-level check off
DISABLE = textwrap.dedent("""\
    import sys
    _m = sys.modules['__main__']
    _m._BLOCKED_EVENTS = ('nothing.',)
    _m._NATIVE_MODULES = ()
    _m._READ_ROOTS = ('/',)
    _m.WORKDIR = '/'
    _m._audit.__code__ = (lambda event, args: None).__code__
    import ctypes, socket, subprocess, resource, signal, os  # all refused by the hook while it was on
    print('HOOK_OFF')
""")

REPL_MODULE = sys.modules[PythonREPL.__module__].__file__
REFUSED = ("PermissionError", "Operation not permitted", "Permission denied", "not allowed to raise")


@pytest.fixture
def repl():
    with PythonREPL(timeout_s=10.0, cpu_s=30, memory_mb=512) as r:
        yield r


@pytest.fixture
def listener():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.3)
    yield server
    server.close()


def escape(repl: PythonREPL, code: str) -> str:
    """Run ``code`` with the Python-level checks off: its observation, which must show a refusal."""
    result = repl.run(DISABLE + code)
    assert "HOOK_OFF" in result.output, f"the Python-level checks were not switched off: {result.observation()}"
    observation = result.observation()
    assert result.error is not None and any(r in result.error for r in REFUSED), observation
    assert repl.run("print('alive')").observation() == "alive"  # the REPL still answers
    return observation


def no_connection(listener: socket.socket) -> bool:
    try:
        conn, _ = listener.accept()
    except (TimeoutError, socket.timeout):
        return True
    conn.close()
    return False


def test_the_hook_is_on_until_switched_off(repl):
    assert "importing ctypes is not allowed" in repl.run("import ctypes").observation()
    assert repl.run(DISABLE).observation() == "HOOK_OFF"
    assert repl.layers.keys() >= {"filesystem", "processes", "network"}


def test_write_outside_the_work_directory(repl):
    for target in (f"/tmp/escape_{uuid.uuid4().hex}", os.path.join(os.getcwd(), f"escape_{uuid.uuid4().hex}")):
        try:
            escape(repl, f"open({target!r}, 'w').write('x')")
            assert not os.path.exists(target)
        finally:
            if os.path.exists(target):
                os.remove(target)
    # ... while the work directory itself stays writable
    assert repl.run(DISABLE + "open('inside.txt', 'w').write('x')").error is None
    assert os.path.exists(os.path.join(repl.workdir, "inside.txt"))


@pytest.mark.skipif(not os.path.exists("/etc/shadow"), reason="no /etc/shadow on this machine")
def test_read_etc_shadow(repl):
    assert "root:" not in escape(repl, "print(open('/etc/shadow').read())")


@pytest.mark.parametrize("pid", ["1", "trainer"])
def test_read_another_process_environment(repl, pid):
    pid = str(os.getpid()) if pid == "trainer" else pid
    escape(repl, f"print(open('/proc/{pid}/environ').read())")


def test_connect_to_a_local_tcp_listener(repl, listener):
    port = listener.getsockname()[1]
    escape(repl, f"socket.create_connection(('127.0.0.1', {port}), timeout=2)")
    assert no_connection(listener), "the listener got a connection from the sandbox"


def test_fork(repl):
    marker = f"/tmp/escape_{uuid.uuid4().hex}"
    observation = escape(
        repl, f"pid = os.fork()\nif pid == 0:\n    open({marker!r}, 'w')\n    os._exit(0)\nprint('forked', pid)"
    )
    assert "forked" not in observation and not os.path.exists(marker)


X86_64 = pytest.mark.skipif(platform.machine() != "x86_64", reason="raw x86-64 syscall numbers and machine code")
RAW_FORK = ("libc = ctypes.CDLL(None, use_errno=True)\npid = libc.syscall(NR)\n"
            "if pid == 0:\n    libc.syscall(60, 0)  # the child exits at once (raw exit: a vfork child shares memory)\n"
            "if pid < 0:\n    raise PermissionError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))\n"
            "print('forked', pid)")


@X86_64
@pytest.mark.parametrize("nr", [57, 58], ids=["fork", "vfork"])
def test_raw_fork_syscalls(repl, nr):
    """The fork and vfork syscalls themselves (``os.fork`` goes through clone)."""
    assert "forked" not in escape(repl, RAW_FORK.replace("NR", str(nr)))


@pytest.fixture
def udp_listener():
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    server.settimeout(0.3)
    yield server
    server.close()


def test_send_a_udp_datagram(repl, udp_listener):
    """UDP: Landlock's network rules cover TCP only; seccomp refuses the socket."""
    port = udp_listener.getsockname()[1]
    escape(repl, f"socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', {port}))")
    with pytest.raises((TimeoutError, socket.timeout)):
        udp_listener.recvfrom(16)


def static_program(code: int) -> bytes:
    """A minimal static x86-64 ELF that exits with ``code``: no loader, no libraries, so only the
    execve itself stands between code that writes it and running it."""
    text = bytes([0xBF]) + code.to_bytes(4, "little") + bytes([0xB8, 60, 0, 0, 0, 0x0F, 0x05])  # exit(code)
    base, header, segment = 0x400000, 64, 56
    size = header + segment + len(text)
    elf = struct.pack("<4sBBBBB7sHHIQQQIHHHHHH", b"\x7fELF", 2, 1, 1, 0, 0, b"\0" * 7, 2, 0x3E, 1,
                      base + header + segment, header, 0, 0, header, segment, 1, 0, 0, 0)
    return elf + struct.pack("<IIQQQQQQ", 1, 5, 0, base, base, size, size, 0x1000) + text


EXEC_OWN = "open('prog', 'wb').write(PROGRAM)\nos.chmod('prog', 0o755)\nos.execv('prog', ['prog'])"


@X86_64
def test_exec_a_program_written_into_the_work_directory(repl):
    """The work directory is writable (and Landlock grants it every right): a program the code
    writes there must still not run."""
    escape(repl, EXEC_OWN.replace("PROGRAM", repr(static_program(42))))


@pytest.mark.parametrize("how", ["execv", "subprocess"])
def test_exec_a_shell(repl, how):
    marker = f"/tmp/escape_{uuid.uuid4().hex}"
    code = (f"os.execv('/bin/sh', ['/bin/sh', '-c', 'touch {marker}'])" if how == "execv"
            else f"subprocess.run(['/bin/sh', '-c', 'touch {marker}'])")
    escape(repl, code)
    assert not os.path.exists(marker)


@pytest.mark.parametrize("target", ["trainer", "zygote"])
def test_kill_the_trainer(repl, target):
    from lit_agents.envs import repl as module

    pid = os.getpid() if target == "trainer" else module._zygote.proc.pid
    escape(repl, f"os.kill({pid}, signal.SIGKILL)")
    if target == "zygote":
        assert module._zygote.alive()
    # ... and this process is still here to check


@pytest.mark.parametrize("limit", ["RLIMIT_CPU", "RLIMIT_AS"])
def test_raise_the_rlimits(repl, limit):
    before = repl.run(f"import resource\nprint(resource.getrlimit(resource.{limit}))").observation()
    escape(repl, f"soft, hard = resource.getrlimit(resource.{limit})\n"
                 f"resource.setrlimit(resource.{limit}, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))")
    assert repl.run(f"import resource\nprint(resource.getrlimit(resource.{limit}))").observation() == before


def test_limits_are_frozen_once_set(repl):
    """Not only the missing capability: seccomp refuses any new limit, even a lower one (which
    needs no privilege), so raising one cannot work whatever the worker's capabilities."""
    before = repl.run("import resource\nprint(resource.getrlimit(resource.RLIMIT_CPU))").observation()
    escape(repl, "soft, hard = resource.getrlimit(resource.RLIMIT_CPU)\n"
                 "resource.setrlimit(resource.RLIMIT_CPU, (soft - 1, hard))")
    assert repl.run("import resource\nprint(resource.getrlimit(resource.RLIMIT_CPU))").observation() == before


def test_ptrace_the_trainer(repl):
    code = (f"libc = ctypes.CDLL(None, use_errno=True)\n"
            f"if libc.ptrace(16, {os.getpid()}, 0, 0) != 0:  # PTRACE_ATTACH\n"
            f"    raise PermissionError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))\n"
            f"print('attached')")
    assert "attached" not in escape(repl, code)
    with open("/proc/self/status") as f:
        assert "TracerPid:\t0\n" in f.read()


def test_the_worker_has_no_privileges(repl):
    status = repl.run(DISABLE + "print(open('/proc/self/status').read())").output
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    assert int(fields["CapEff"], 16) == 0 and int(fields["CapPrm"], 16) == 0 and int(fields["CapAmb"], 16) == 0
    assert fields["NoNewPrivs"].strip() == "1" and fields["Seccomp"].strip() == "2"
    if os.getuid() == 0:
        assert fields["Uid"].split()[:3] == ["65534"] * 3 and fields["Groups"].strip() == ""


def test_exec_spawned_workers_are_contained_too():
    marker = f"/tmp/escape_{uuid.uuid4().hex}"
    with PythonREPL(timeout_s=10.0, spawn="exec") as r:
        escape(r, f"open({marker!r}, 'w')")
        escape(r, f"os.kill({os.getpid()}, signal.SIGKILL)")
    assert not os.path.exists(marker)


def test_asyncio_run_works():
    code = ("import asyncio\n\nasync def main():\n    await asyncio.sleep(0.01)\n"
            "    return sum(await asyncio.gather(*(asyncio.sleep(0, result=i) for i in range(4))))\n\n"
            "print(asyncio.run(main()))")
    with PythonREPL(timeout_s=10.0) as r:
        assert r.run(code).observation() == "6"
        assert "not allowed" in r.run("import socket\nsocket.socket(socket.AF_INET)").observation()  # still friendly
        assert r.run("import threading\nt = threading.Thread(target=print, args=('thread',))\nt.start()\nt.join()"
                     ).observation() == "thread"


def test_a_missing_layer_refuses_unless_a_weaker_mode_is_chosen_by_name(caplog):
    class Simulated(PythonREPL):
        def __init__(self, **kwargs):
            self._simulate = kwargs.pop("simulate")
            super().__init__(**kwargs)

        def _start(self):
            self.limits["simulate_missing"] = self._simulate
            super()._start()

    with pytest.raises(SandboxUnavailable, match=r"filesystem \(Landlock\).*containment='python-only'"):
        Simulated(simulate="filesystem (Landlock)")
    assert "filesystem (Landlock)" in caplog.text
    with pytest.raises(ValueError, match="containment"):
        PythonREPL(containment="none")
    with PythonREPL(containment="python-only") as weak:  # chosen by name: runs, with the hook only
        assert weak.layers == {} and weak.run("print(1)").observation() == "1"
        assert "os.fork is not allowed" in weak.run("import os\nos.fork()").observation()


# ------------------------------------------------------------------ each kernel layer on its own
class OneLayer(PythonREPL):
    """A REPL whose worker applies only the kernel layers named (the worker's test-only
    ``layers_under_test``): each layer must hold on its own, not only under the others."""

    def __init__(self, layers, **kwargs):
        self._layers = layers
        super().__init__(timeout_s=10.0, cpu_s=30, memory_mb=512, **kwargs)

    def _start(self):
        self.limits["layers_under_test"] = list(self._layers)
        super()._start()


@pytest.fixture
def target():
    """A process of the trainer's user outside the sandbox, for signals and ptrace to aim at."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def _landlock_abi() -> int:
    import ctypes

    return ctypes.CDLL(None).syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))  # x86-64 and arm64


KILL = "os.kill(PID, signal.SIGKILL)"
PTRACE = ("libc = ctypes.CDLL(None, use_errno=True)\nif libc.ptrace(16, PID, 0, 0) != 0:  # PTRACE_ATTACH\n"
          "    raise PermissionError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))\nprint('attached')")


def _layer_cases(layer: str, tmp_path, listener, udp_listener) -> dict[str, str]:
    """The escapes ``layer`` alone must refuse (with the worker as root where identity is off)."""
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    abi = _landlock_abi() if layer == "filesystem" else 0
    cases = {
        "processes": {
            "clone": "print('forked', os.fork())",
            "exec": EXEC_OWN.replace("PROGRAM", repr(static_program(42))) if platform.machine() == "x86_64" else None,
            "raw fork": RAW_FORK.replace("NR", "57") if platform.machine() == "x86_64" else None,
            "raw vfork": RAW_FORK.replace("NR", "58") if platform.machine() == "x86_64" else None,
            "udp": f"socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', "
                   f"{udp_listener.getsockname()[1]}))",
            "tcp": f"socket.create_connection(('127.0.0.1', {listener.getsockname()[1]}), timeout=2)",
            "kill": KILL,
            "ptrace": PTRACE,
            "rlimit": "resource.setrlimit(resource.RLIMIT_CPU, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))",
        },
        "filesystem": {
            "write": f"open({str(tmp_path / 'written.txt')!r}, 'w').write('x')",
            "read": f"print(open({str(outside)!r}).read())",
            "tcp": f"socket.create_connection(('127.0.0.1', {listener.getsockname()[1]}), timeout=2)"
                   if abi >= 4 else None,
            "kill": KILL if abi >= 6 else None,
            "ptrace": PTRACE,
        },
        "identity": {"kill": KILL, "ptrace": PTRACE},
    }[layer]
    return {name: code for name, code in cases.items() if code is not None}


@pytest.mark.parametrize("layer", ["processes", "filesystem", "identity"])
def test_each_kernel_layer_holds_on_its_own(layer, tmp_path, target, listener, udp_listener):
    """seccomp alone, Landlock alone, the dropped identity alone: each refuses the escapes it is
    there for, whatever the other layers would also have caught (the stack hides a layer's
    missing rule: on a kernel whose Landlock scopes signals, a lost seccomp kill rule goes
    unnoticed by the whole-stack tests). The identity layer needs a root trainer."""
    if layer == "identity" and os.getuid() != 0:
        pytest.skip("the identity layer changes the uid of a root trainer only")
    with OneLayer([layer]) as r:
        assert set(r.layers) == {layer}
        for name, code in _layer_cases(layer, tmp_path, listener, udp_listener).items():
            observation = escape(r, code.replace("PID", str(target.pid)))
            assert not any(s in observation for s in ("forked", "attached", "secret")), (layer, name, observation)
            assert target.poll() is None, (layer, name, "the target was killed")
    with open(f"/proc/{target.pid}/status") as f:
        assert "TracerPid:\t0\n" in f.read()
    assert not (tmp_path / "written.txt").exists() and no_connection(listener)
    with pytest.raises((TimeoutError, socket.timeout)):
        udp_listener.recvfrom(16)


# ------------------------------------------------------------------ as a non-root trainer
NON_ROOT_SCRIPT = """
import importlib.util, json, os, sys
disable, cases, path = json.loads(sys.argv[1])
spec = importlib.util.spec_from_file_location("repl", path)  # the module alone: no torch import
module = sys.modules["repl"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
PythonREPL = module.PythonREPL
out = {"uid": os.getuid()}
with PythonREPL(timeout_s=10.0) as r:
    out["layers"] = r.layers
    for name, code in cases.items():
        code = code.replace("TRAINER", str(os.getpid()))
        result = r.run(disable + code)
        out[name] = [result.output, result.error, r.run("print('alive')").observation()]
with PythonREPL(timeout_s=1.0, wall_timeout_s=60.0) as r:  # the CPU clock reads for a non-root trainer
    out["busy"] = r.run("while True:\\n    pass").observation()
print(json.dumps(out))
"""


def _as_uid_65534():
    os.setgroups([])
    os.setresgid(65534, 65534, 65534)
    os.setresuid(65534, 65534, 65534)


def _in_user_namespace():
    """Non-root in a user namespace of its own: uid 1000 there, no capabilities after the exec."""
    import ctypes

    outside_uid, outside_gid = os.geteuid(), os.getegid()  # (unmapped once unshared)
    if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:  # CLONE_NEWUSER
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER)")
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"1000 {outside_uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"1000 {outside_gid} 1")


def _non_root_runner():
    """A way to run this project's Python as a non-root user here: (name, preexec), or a reason to skip."""
    env = dict(os.environ)
    probe = [sys.executable, "-c", f"import os; open({REPL_MODULE!r}).close(); assert os.getuid() != 0"]
    reasons = []
    if os.getuid() != 0:
        return "as-is", None, env, None
    for name, preexec in (("uid 65534", _as_uid_65534), ("user namespace", _in_user_namespace)):
        try:
            done = subprocess.run(probe, preexec_fn=preexec, env=env, capture_output=True, text=True, timeout=60,
                                  cwd="/tmp")
        except (OSError, subprocess.SubprocessError) as err:
            reasons.append(f"{name}: {err}")
            continue
        if done.returncode == 0:
            return name, preexec, env, None
        reasons.append(f"{name}: {done.stderr.strip().splitlines()[-1:] or done.returncode}")
    return None, None, None, "; ".join(reasons)


def test_escapes_are_refused_for_a_non_root_trainer(listener):
    name, preexec, env, why = _non_root_runner()
    if name is None:
        pytest.skip(f"no way to run a non-root Python here ({why})")
    marker = f"/tmp/escape_{uuid.uuid4().hex}"
    port = listener.getsockname()[1]
    cases = {
        "write": f"open({marker!r}, 'w').write('x')",
        "shadow": "print(open('/etc/shadow').read())",
        "environ": "print(open('/proc/1/environ').read())",
        "connect": f"socket.create_connection(('127.0.0.1', {port}), timeout=2)",
        "fork": "print('forked', os.fork())",
        "exec": f"os.execv('/bin/sh', ['/bin/sh', '-c', 'touch {marker}'])",
        "kill": "os.kill(TRAINER, signal.SIGKILL)",
        "rlimit": "resource.setrlimit(resource.RLIMIT_CPU, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))",
        "ptrace": ("libc = ctypes.CDLL(None, use_errno=True)\nif libc.ptrace(16, TRAINER, 0, 0) != 0:\n"
                   "    raise PermissionError(ctypes.get_errno(), 'ptrace')\nprint('attached')"),
    }
    try:
        done = subprocess.run(
            [sys.executable, "-c", NON_ROOT_SCRIPT, json.dumps([DISABLE, cases, REPL_MODULE])],
            env=env,
            preexec_fn=preexec,
            capture_output=True,
            text=True,
            timeout=120,
            cwd="/tmp",
        )
        assert done.returncode == 0, f"the non-root trainer died ({done.returncode}): {done.stderr[-2000:]}"
        out = json.loads(done.stdout.strip().splitlines()[-1])
        assert out["uid"] != 0 and out["layers"].keys() >= {"filesystem", "processes", "network"}
        for case in cases:
            output, error, alive = out[case]
            assert "HOOK_OFF" in output, (case, output, error)
            assert error is not None and any(r in error for r in REFUSED), (case, error)
            assert alive == "alive", (case, alive)
            assert not any(s in output for s in ("root:", "forked", "attached")), (case, output)
        assert not os.path.exists(marker)
        assert no_connection(listener)
        assert "used more than 1 s of CPU time" in out["busy"], out["busy"]
    finally:
        if os.path.exists(marker):
            os.remove(marker)

