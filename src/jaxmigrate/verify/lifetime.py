"""Nothing runs after jaxmigrate exits, however it exits; scratch folders go with it.

Every process that runs the user's code (workers, the `--verify-with` command, a notebook's
script) is started through `spawn`: behind a guard (`child/guard.py`), in its own session, and
registered here. The guard ends with jaxmigrate (`PR_SET_PDEATHSIG`, and a poll of its parent's
pid), is a subreaper for what escaped with `setsid`, and kills everything below it when it is
asked to stop or its command ends. `PR_SET_PDEATHSIG` fires when the *thread* that started the
process ends, so every guard is started from one long-lived thread of its own.

While `running()` is active (one verification), SIGTERM, SIGHUP and SIGINT stop every
registered process at once, refuse new ones, and unwind (SystemExit 128+N; SIGINT as
KeyboardInterrupt), so the `finally` clauses remove the scratch folder. A SIGKILL of jaxmigrate
itself leaves the folder: `sweep` removes such folders at the next start, only ours (named
`jaxmigrate-verify-*`, owned by this user, holding an `owner` file) and only if the run that
made them is dead.
"""

from __future__ import annotations

import atexit
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

PREFIX = "jaxmigrate-verify-"
OWNER = "owner"
GUARD = Path(__file__).with_name("child") / "guard.py"
STOP_GRACE = 5.0  # seconds a guard gets to kill what is below it before its group is killed

_children: set[subprocess.Popen[bytes]] = set()
_closing = threading.Event()
_spawner: list[ThreadPoolExecutor] = []
_lock = threading.Lock()


class Stopping(OSError):
    """Verification is being stopped (a signal): no new process is started."""

    def __init__(self) -> None:
        super().__init__("verification is stopping")


ALLOW_NETWORK = "JAXMIGRATE_VERIFY_NETWORK"  # =allow: run without the network sandbox
NOT_ISOLATED = "the run was not isolated from the network"


class Sandbox:
    """The network namespace of one verification, held by a guard started with `--hold`."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.why = ""  # why the run is not isolated, or ''

    @property
    def holder(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        self.why = ""
        if os.environ.get(ALLOW_NETWORK) == "allow":
            self.why = f"{NOT_ISOLATED}: {ALLOW_NETWORK}=allow"
            return
        command = [sys.executable, "-I", "-S", str(GUARD), "--parent", str(os.getpid()), "--hold"]

        def start() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
            )

        try:
            proc = spawner().submit(start).result()
        except OSError as exc:
            self.why = f"{NOT_ISOLATED}: {exc}"
            return
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30.0)
        answer = proc.stdout.readline().decode(errors="replace").strip() if ready else ""
        if answer == "ok":
            self.proc = proc
            return
        self.why = f"{NOT_ISOLATED}: {answer.removeprefix('no: ') or 'no answer from unshare'}"
        self.stop(proc)

    def stop(self, proc: subprocess.Popen[bytes] | None = None) -> None:
        proc = proc or self.proc
        self.proc = None
        if proc is None:
            return
        proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


_sandbox = Sandbox()


def isolation() -> str:
    """Return why the current verification is not isolated from the network, or ''."""
    return _sandbox.why


def guarded(command: Sequence[str]) -> list[str]:
    """Return `command` run behind a guard (in the run's network sandbox, if there is one)."""
    options = ["--parent", str(os.getpid())]
    if _sandbox.holder is not None:
        options += ["--netns", str(_sandbox.holder)]
    return [sys.executable, "-I", "-S", str(GUARD), *options, "--", *command]


def spawner() -> ThreadPoolExecutor:
    with _lock:
        if not _spawner:
            _spawner.append(ThreadPoolExecutor(1, thread_name_prefix="jaxmigrate-spawner"))
        return _spawner[0]


def spawn(command: Sequence[str], **popen: Any) -> subprocess.Popen[bytes]:
    """Start `command` behind a guard, in a session of its own, registered until `stop`ped.

    Raises OSError if it cannot start, `Stopping` once a signal asked verification to stop.
    """

    def start() -> subprocess.Popen[bytes]:
        if _closing.is_set():
            raise Stopping()
        proc: subprocess.Popen[bytes] = subprocess.Popen(
            guarded(command), start_new_session=True, **popen
        )
        _children.add(proc)
        if _closing.is_set():  # a signal came while it started
            terminate(proc)
        return proc

    return spawner().submit(start).result()


POLL = 0.1  # seconds the main thread sleeps in the kernel at most while it waits for a thread


def outcome(future: Future[T]) -> T:
    """Return `future`'s result, waited for in short sleeps.

    The kernel may hand a signal sent to the process (SIGINT to its group, Ctrl-C) to any thread
    that does not block it, and Python runs the handlers only on the main thread, between
    bytecodes: a main thread asleep in the kernel until a lane thread answered ran the handler
    only when the hanging code timed out. Waking every `POLL` seconds, it runs it at once."""
    while True:
        try:
            return future.result(timeout=POLL)
        except TimeoutError:
            continue


def stopping() -> bool:
    """Return whether a signal asked this verification to stop."""
    return _closing.is_set()


def terminate(proc: subprocess.Popen[bytes]) -> None:
    """Ask a guard to kill everything below it (never waits)."""
    try:
        os.kill(proc.pid, signal.SIGTERM)
    except OSError:
        pass


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill a guarded process and everything below it, then reap it."""
    if proc.poll() is None:
        terminate(proc)
        try:
            proc.wait(timeout=STOP_GRACE)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of its session's group
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    _children.discard(proc)


def stop_all() -> None:
    for proc in list(_children):
        terminate(proc)


atexit.register(stop_all)


def on_signal(number: int, frame: object) -> None:
    """Stop every process of the run at once, then unwind so the scratch folder is removed."""
    _closing.set()
    stop_all()
    if number == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + number)


@contextmanager
def running() -> Iterator[None]:
    """Hold the network sandbox, and handle SIGTERM, SIGHUP and SIGINT (main thread only),
    during one verification."""
    _closing.clear()
    sweep()
    _sandbox.start()
    try:
        with signals():
            yield
    finally:
        _sandbox.stop()


@contextmanager
def signals() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    numbers = [signal.SIGTERM, signal.SIGINT] + (
        [signal.SIGHUP] if hasattr(signal, "SIGHUP") else []
    )
    previous = {n: signal.getsignal(n) for n in numbers}
    for number in numbers:
        if previous[number] is not signal.SIG_IGN:
            signal.signal(number, on_signal)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def start_time(pid: int) -> str:
    """Return when process `pid` started (clock ticks since boot, Linux), or '' if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read().decode(errors="replace")
    except OSError:
        return ""
    return stat[stat.rfind(")") + 2 :].split()[19]


def claim(base: Path) -> None:
    """Write who owns a scratch folder: this process's pid and start time."""
    (base / OWNER).write_text(f"{os.getpid()} {start_time(os.getpid())}\n", encoding="utf-8")


def alive(pid: int, started: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not started or start_time(pid) in ("", started)


def sweep(folder: Path | None = None) -> list[Path]:
    """Remove the scratch folders of runs that died without removing them; return them."""
    where = Path(folder or tempfile.gettempdir())
    removed = []
    try:
        candidates = [p for p in where.iterdir() if p.name.startswith(PREFIX)]
    except OSError:
        return []
    for path in candidates:
        try:
            if path.is_symlink() or not path.is_dir() or path.stat().st_uid != os.getuid():
                continue
            pid, _, started = (path / OWNER).read_text(encoding="utf-8").strip().partition(" ")
            if alive(int(pid), started):
                continue
        except (OSError, ValueError):
            continue  # not ours, or not a run we can tell is dead
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed
