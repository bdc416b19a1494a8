"""Worker processes: start them, send one request at a time, and survive whatever they do.

A worker runs `python -m _jaxmigrate_child.worker` under the user's interpreter in its own
session (so a kill reaches anything it forked), with the simulated-mesh environment, in one side's
copy of the tree. It starts JAX once and then serves requests. A reply that does not come within
the timeout, or a worker that dies, becomes a `Reply` with a fault (timed out, crashed with which
signal, exited with which status, plus the telling line of its log); the worker is then killed and
started again on the next request.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from jaxmigrate.verify.config import VerifyConfig
from jaxmigrate.verify.workspace import CHILD_PACKAGE, Workspace

STARTUP_TIMEOUT = 120.0
TELLING = ("Fatal Python error", "Check failed", "MemoryError", "RESOURCE_EXHAUSTED", "Error")


@dataclass(frozen=True)
class Reply:
    """A worker's answer (`data`), or why there is none (`fault`, of kind timeout/crash/start)."""

    data: dict[str, Any]
    fault: str = ""
    kind: str = ""


def child_env(
    config: VerifyConfig, ws: Workspace, extra_path: tuple[Path, ...] = ()
) -> dict[str, str]:
    """Return the environment of a child: the simulated mesh, CPU only, our package on the path."""
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in f]
    env["XLA_FLAGS"] = " ".join(
        [*flags, f"--xla_force_host_platform_device_count={config.devices}"]
    )
    env["JAX_PLATFORMS"] = "cpu"
    env.setdefault("PYTHONHASHSEED", "0")
    path = [str(p) for p in (*extra_path, ws.child)]
    env["PYTHONPATH"] = os.pathsep.join([*path, *filter(None, [env.get("PYTHONPATH")])])
    bindir = str(Path(config.python).parent)
    env["PATH"] = os.pathsep.join([bindir, env.get("PATH", "")])
    return env


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill a child and everything in its session, then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def telling_line(log: Path) -> str:
    """Return the most informative recent line of a worker's log, or ''."""
    try:
        with log.open("rb") as handle:
            handle.seek(max(0, log.stat().st_size - 8192))
            lines = handle.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    lines = [line.strip() for line in lines if line.strip()]
    for marker in TELLING:
        for line in reversed(lines):
            if marker in line:
                return line[:200]
    return lines[-1][:200] if lines else ""


def exit_reason(returncode: int | None) -> str:
    """Return how a process ended, in words."""
    if returncode is None:
        return "stopped answering"
    if returncode < 0:
        try:
            return f"crashed ({signal.Signals(-returncode).name})"
        except ValueError:
            return f"crashed (signal {-returncode})"
    return f"exited with status {returncode}"


class Worker:
    """One worker process for one side; restarted after any fault."""

    def __init__(self, side: str, config: VerifyConfig, ws: Workspace, index: int) -> None:
        self.side = side
        self.config = config
        self.ws = ws
        self.log = ws.logs / f"{side}-{index}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready = False
        self.buffer = b""
        self.spawn_error = ""
        self.spawn()

    def spawn(self) -> None:
        """Start the process; it imports JAX in the background until the first request."""
        root = self.ws.tree(self.side)
        command = [
            self.config.python,
            "-m",
            f"{CHILD_PACKAGE}.worker",
            "--side",
            self.side,
            "--root",
            str(root),
            "--memory",
            str(self.config.memory_limit),
        ]
        self.ready = False
        self.buffer = b""
        self.spawn_error = ""
        with self.log.open("ab") as log:
            try:
                self.proc = subprocess.Popen(
                    command,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    cwd=root,
                    env=child_env(self.config, self.ws),
                    start_new_session=True,
                )
            except OSError as exc:
                self.proc = None
                self.spawn_error = f"{self.config.python}: {exc.strerror or exc}"

    def readline(self, deadline: float) -> bytes | None:
        """Return the next line from the worker, None at EOF; raise TimeoutError at deadline."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            readable, _, _ = select.select([fd], [], [], remaining)
            if readable:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return None
                self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def receive(self, timeout: float) -> Reply:
        """Wait for one reply; turn silence or death into a fault."""
        try:
            line = self.readline(time.monotonic() + timeout)
        except TimeoutError:
            self.stop()
            return Reply({}, f"timed out after {timeout:g} s", kind="timeout")
        if line is None:
            return self.died()
        try:
            return Reply(json.loads(line))
        except json.JSONDecodeError:
            self.stop()
            return Reply({}, f"sent garbage: {line[:100]!r}", kind="crash")

    def died(self) -> Reply:
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        self.stop()
        detail = telling_line(self.log)
        return Reply({}, exit_reason(code) + (f": {detail}" if detail else ""), kind="crash")

    def ensure_ready(self) -> Reply | None:
        """Start the worker if needed and wait until JAX is up; return a fault, or None."""
        if self.proc is None:
            self.spawn()
        if self.proc is None:
            return Reply({}, f"could not start a worker: {self.spawn_error}", kind="start")
        if self.ready:
            return None
        reply = self.receive(max(STARTUP_TIMEOUT, self.config.timeout))
        if reply.fault:
            return Reply({}, f"could not start a worker: it {reply.fault}", kind="start")
        self.ready = True
        return None

    def send(self, message: dict[str, Any]) -> bool:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return False
        return True

    def request(self, message: dict[str, Any], timeout: float) -> Reply:
        """Send one request and return the reply (or the fault)."""
        fault = self.ensure_ready()
        if fault is not None:
            self.stop()
            return fault
        if not self.send(message):
            return self.died()
        return self.receive(timeout)

    def stop(self) -> None:
        """Kill the worker (and whatever it forked); the next request starts a new one."""
        if self.proc is not None:
            stdin: IO[bytes] | None = self.proc.stdin
            kill_group(self.proc)
            for stream in (stdin, self.proc.stdout):
                if stream is not None:
                    stream.close()
        self.proc = None
        self.ready = False
        self.buffer = b""
