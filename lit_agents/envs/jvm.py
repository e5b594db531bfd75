"""Java game servers for the published text worlds that ship a Scala game as a jar (TextWorldExpress,
ScienceWorld), reached over py4j as those packages' own wrappers do.

The packages' wrappers start one JVM per wrapper object and hold one game in it. Here:

- `JavaServer`: one JVM running a game jar behind a py4j gateway, launched as the wrappers do but
  with the game's debug printing switched off (ScienceWorld prints every step to stdout, which
  py4j then reads line by line in a Python thread) and with the serial collector
  (``-XX:+UseSerialGC``: about 240 MB resident per ScienceWorld JVM instead of about 760 MB).
- `ServerPool`: idle JVMs of one jar and options, reused across episodes, per Python process.
- `Lease`: a Java game object lent to one episode state; it goes back (the Java object is freed,
  an exclusive JVM returns to the pool) when the episode ends or the state is garbage-collected.

Everything is per process: a forked child never talks to its parent's JVMs (it starts its own),
and py4j's automatic memory management is off, so no garbage-collection message crosses a socket
that a child inherited. JVMs exit with the Python process (``die_on_exit``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import weakref
from collections.abc import Sequence
from typing import Any

#: JVM options of every game server (override per env with ``java_options``)
DEFAULT_JAVA_OPTIONS: tuple[str, ...] = ("-XX:+UseSerialGC",)
JAVA_HINT = "install Java 11+ and put `java` on PATH (e.g. `apt-get install openjdk-17-jre-headless`)"


def require_java(what: str) -> None:
    """Raise a clear error when no ``java`` is on PATH."""
    if shutil.which("java") is None:
        raise RuntimeError(f"{what} runs its game in Java: {JAVA_HINT}")


class JavaServer:
    """One JVM running ``jar`` behind a py4j gateway (``jvm`` reaches its classes)."""

    def __init__(self, jar: str, java_options: Sequence[str] = DEFAULT_JAVA_OPTIONS) -> None:
        from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway

        require_java(os.path.basename(jar))
        port, proc = launch_gateway(
            classpath=jar, die_on_exit=True, cwd=os.path.dirname(jar),
            javaopts=list(java_options), return_proc=True,
        )
        params = GatewayParameters(port=port, auto_field=True, enable_memory_management=False)
        self.gateway = JavaGateway(gateway_parameters=params, java_process=proc)
        self.jvm = self.gateway.jvm
        self.pid = os.getpid()
        io = self.jvm.java.io
        self.jvm.java.lang.System.setOut(io.PrintStream(io.OutputStream.nullOutputStream()))

    @property
    def alive(self) -> bool:
        """Owned by this process and still running."""
        return self.pid == os.getpid() and self.gateway.java_process.poll() is None

    def close(self) -> None:
        """Stop the JVM (only from the process that started it)."""
        if self.pid != os.getpid():
            return
        proc = self.gateway.java_process
        with contextlib.suppress(Exception):  # a dead gateway is already shut
            self.gateway.shutdown()
        if proc.poll() is None:
            try:
                proc.stdin.close()  # --die-on-broken-pipe: the JVM exits on EOF
                proc.wait(timeout=10)
            except Exception:  # noqa: BLE001
                proc.kill()


class ServerPool:
    """JVMs of one jar and options in this process: one ``shared`` server, plus idle exclusive ones.

    Args:
        jar: the game jar.
        java_options: JVM options.
        max_idle: exclusive servers kept idle for reuse; more given back are stopped.
    """

    def __init__(self, jar: str, java_options: Sequence[str], max_idle: int) -> None:
        self.jar, self.java_options, self.max_idle = jar, tuple(java_options), max_idle
        self._idle: list[JavaServer] = []
        self._shared: JavaServer | None = None
        self._lock = threading.Lock()
        self.started = 0  # JVMs launched (for tests and diagnostics)

    def _launch(self) -> JavaServer:
        self.started += 1
        return JavaServer(self.jar, self.java_options)

    def shared(self) -> JavaServer:
        """The one server that every caller in this process shares (started on first use)."""
        with self._lock:
            if self._shared is None or not self._shared.alive:
                self._shared = self._launch()
            return self._shared

    def acquire(self) -> JavaServer:
        """An idle server, or a new one (a JVM start: seconds)."""
        with self._lock:
            while self._idle:
                server = self._idle.pop()
                if server.alive:
                    return server
        return self._launch()

    def release(self, server: JavaServer) -> None:
        """Give an exclusive server back for reuse."""
        if not server.alive:
            return
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(server)
                return
        server.close()

    @property
    def idle(self) -> int:
        return len(self._idle)

    def close(self) -> None:
        """Stop every idle server and the shared one."""
        with self._lock:
            servers = self._idle + ([self._shared] if self._shared is not None else [])
            self._idle, self._shared = [], None
        for server in servers:
            server.close()


_POOLS: dict[tuple[int, str, tuple[str, ...]], ServerPool] = {}
_POOLS_LOCK = threading.Lock()


def server_pool(jar: str, java_options: Sequence[str], max_idle: int = 4) -> ServerPool:
    """This process's pool for a jar and options (created on first use)."""
    key = (os.getpid(), jar, tuple(java_options))
    with _POOLS_LOCK:
        if key not in _POOLS:
            _POOLS[key] = ServerPool(jar, java_options, max_idle)
        pool = _POOLS[key]
        pool.max_idle = max(pool.max_idle, max_idle)
        return pool


def _give_back(server: JavaServer, game: Any, pool: ServerPool | None) -> None:
    if server.pid != os.getpid():
        return
    with contextlib.suppress(Exception):  # the JVM may be gone
        server.gateway.detach(game)
    if pool is not None:
        pool.release(server)


class Lease:
    """A Java game object lent to ``owner`` (an episode state) on ``server``.

    ``close()`` gives it back; so does the owner's garbage collection. With ``pool`` the server
    itself was lent exclusively and returns to the pool.
    """

    def __init__(self, owner: Any, server: JavaServer, game: Any, pool: ServerPool | None) -> None:
        self.server, self.game = server, game
        self._finalizer = weakref.finalize(owner, _give_back, server, game, pool)
        self._finalizer.atexit = False

    @property
    def usable(self) -> bool:
        return self._finalizer.alive and self.server.alive

    def close(self) -> None:
        self._finalizer()


class LeasedState:
    """Mixin for episode states holding a `Lease` (``lease``) and their ``actions``: ``steps``
    counts the actions, and pickling drops the lease (a pickled state replays its actions
    into a fresh game on its next step)."""

    @property
    def steps(self) -> int:
        return len(self.actions)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "lease"} | {"lease": None}
