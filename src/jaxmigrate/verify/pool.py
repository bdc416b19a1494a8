"""Worker processes: start them, send one request at a time, and survive whatever they do.

A worker runs `python -m _jaxmigrate_child.worker` under the user's interpreter behind a guard
(`lifetime`: a kill reaches anything it forked, and nothing outlives jaxmigrate), with the simulated-mesh environment, in one side's
copy of the tree. It starts JAX once and then serves requests. A reply that does not come within
the timeout, or a worker that dies, becomes a `Reply` with a fault (timed out, crashed with which
signal, exited with which status, plus the telling line of its log); the worker is then killed and
started again on the next request.
"""

from __future__ import annotations

import dataclasses
import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from jaxmigrate.verify import lifetime, xlacache
from jaxmigrate.verify.child import protocol
from jaxmigrate.verify.child.protocol import (
    Compared,
    CompareRecords,
    Failed,
    ProtocolError,
    Ran,
    Ready,
    RecordsCompared,
    RunCandidate,
    RunOriginal,
    decode_reply,
    encode,
)
from jaxmigrate.verify.config import VerifyConfig
from jaxmigrate.verify.processes import Coordinator, process_env
from jaxmigrate.verify.workspace import CHILD_PACKAGE, Workspace

STARTUP_TIMEOUT = 120.0
TELLING = ("Fatal Python error", "Check failed", "MemoryError", "RESOURCE_EXHAUSTED", "Error")


Request = RunOriginal | RunCandidate | CompareRecords


@dataclass(frozen=True)
class Reply:
    """A worker's answer, or why there is none (`fault`, of kind timeout/crash/start/protocol).

    `message` is the decoded reply (a `child.protocol` record), combined over the processes of a
    job (`combine`): `processes` of them, and `process` the one whose reply stands for all
    (one that raised or disagreed), or None.
    """

    message: protocol.Reply | None = None
    fault: str = ""
    kind: str = ""
    process: int | None = None
    processes: int = 1


def child_env(
    config: VerifyConfig,
    ws: Workspace,
    extra_path: tuple[Path, ...] = (),
    process: int = 0,
    coordinator: str = "",
    python: str = "",
) -> dict[str, str]:
    """Return the environment of a child: the simulated mesh, CPU only, our package on the path.

    With `config.processes` > 1 it is process `process` of a job coordinated at `coordinator`,
    with its share of the devices.
    """
    env = process_env(os.environ, process, config.processes, config.devices, coordinator)
    env.setdefault("PYTHONHASHSEED", "0")
    path = [str(p) for p in (*extra_path, ws.child)]
    env["PYTHONPATH"] = os.pathsep.join([*path, *filter(None, [env.get("PYTHONPATH")])])
    bindir = str(Path(python or config.python).parent)
    env["PATH"] = os.pathsep.join([bindir, env.get("PATH", "")])
    cache = xlacache.folder(env)
    env.pop(xlacache.ENV, None)
    # made by `verify` (`xlacache.prepare`); never in a job of several processes (`xlacache`)
    if cache is not None and cache.is_dir() and config.processes == 1:
        env[xlacache.ENV] = str(cache)
    return env


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill a child and everything below it (its guard's doing, `lifetime`), then reap it."""
    lifetime.stop(proc)


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


class Process:
    """One OS process of a worker: its pipes, its unread output and its log."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.buffer = b""

    def spawn(self, command: list[str], cwd: Path, env: dict[str, str]) -> str:
        """Start the process; return why it could not start, or ''."""
        self.buffer = b""
        with self.log.open("ab") as log:
            try:
                self.proc = lifetime.spawn(
                    command,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    cwd=cwd,
                    env=env,
                )
            except OSError as exc:
                self.proc = None
                return f"{command[0]}: {exc.strerror or exc}"
        return ""

    def fileno(self) -> int:
        assert self.proc is not None and self.proc.stdout is not None
        return self.proc.stdout.fileno()

    def line(self) -> bytes | None:
        """Return a complete line already read, or None."""
        if b"\n" not in self.buffer:
            return None
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def read(self) -> bool:
        """Read what is available; return False at end of file."""
        chunk = os.read(self.fileno(), 1 << 16)
        self.buffer += chunk
        return bool(chunk)

    def send(self, data: bytes) -> bool:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return False
        return True

    def ended(self) -> str:
        """Return how the (dead or dying) process ended, with the telling line of its log."""
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        detail = telling_line(self.log)
        return exit_reason(code) + (f": {detail}" if detail else "")

    def stop(self) -> None:
        proc, self.proc = self.proc, None  # a signal's unwinding may stop it from another thread
        if proc is not None:
            stdin: IO[bytes] | None = proc.stdin
            kill_group(proc)
            for stream in (stdin, proc.stdout):
                if stream is not None:
                    stream.close()
        self.buffer = b""


class Worker:
    """One worker for one side: one process, or the N processes of a multi-process JAX job.

    Every request goes to every process; the replies are combined into one (`combine`). Any
    fault of one process (a hang, a crash) stops them all: its peers would wait for it in their
    collectives. The next request starts a new job, on a fresh coordinator port.
    """

    def __init__(self, side: str, config: VerifyConfig, ws: Workspace, index: int) -> None:
        self.side = side
        self.config = config
        self.ws = ws
        count = config.processes
        names = [f"{side}-{index}" + (f".p{i}" if count > 1 else "") for i in range(count)]
        self.processes = [Process(ws.logs / f"{name}.log") for name in names]
        self.log = self.processes[0].log
        self.started = False
        self.ready = False
        self.spawn_error = ""
        self.coordinator: Coordinator | None = None  # a multi-process job's, while it runs
        self.jax = ""  # the JAX version the worker runs (its ready message says)
        self.python = config.python_of(side)
        self.spawn()

    def spawn(self) -> None:
        """Start the processes; they import JAX (and join their job) until the first request."""
        root = self.ws.tree(self.side)
        command = [
            self.python,
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
        if self.coordinator is not None:  # a job started before, not stopped
            self.coordinator.close()
        # held until the job stops
        self.coordinator = Coordinator() if len(self.processes) > 1 else None
        coordinator = self.coordinator.address if self.coordinator is not None else ""
        errors = [
            p.spawn(command, root, child_env(self.config, self.ws, (), i, coordinator, self.python))
            for i, p in enumerate(self.processes)
        ]
        self.spawn_error = next((e for e in errors if e), "")
        self.started = not self.spawn_error
        if not self.started:
            self.stop()

    def tag(self, index: int) -> str:
        """Return ' [process i of n]' in a multi-process job, else ''."""
        count = len(self.processes)
        return f" [process {index} of {count}]" if count > 1 else ""

    def receive(self, timeout: float) -> Reply:
        """Wait for one reply from every process; turn silence or death into a fault."""
        deadline = time.monotonic() + timeout
        lines: dict[int, bytes] = {}
        while len(lines) < len(self.processes):
            for i, process in enumerate(self.processes):
                if i not in lines and (line := process.line()) is not None:
                    lines[i] = line
            waiting = [p for i, p in enumerate(self.processes) if i not in lines]
            if not waiting:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                slow = [i for i in range(len(self.processes)) if i not in lines]
                self.stop()
                return Reply(
                    fault=f"timed out after {timeout:g} s{self.tag(slow[0])}", kind="timeout"
                )
            readable, _, _ = select.select(waiting, [], [], remaining)
            for process in readable:
                if not process.read():
                    return self.died(self.processes.index(process))
        return self.decode(lines)

    def decode(self, lines: dict[int, bytes]) -> Reply:
        """Return the processes' replies as one, each checked against the protocol: a worker
        package of another jaxmigrate version is refused with what does not match."""
        replies = []
        for i in range(len(self.processes)):
            try:
                replies.append(decode_reply(lines[i]))
            except ProtocolError as exc:
                self.stop()
                why = f"sent a message this jaxmigrate cannot read: {exc}{self.tag(i)}"
                return Reply(fault=why, kind="protocol")
        out = combine(self.side, replies)
        restart = next((r.restart for r in replies if r.restart), None)
        if restart and out.message is not None:
            out = dataclasses.replace(
                out, message=dataclasses.replace(out.message, restart=restart)
            )
        return out

    def died(self, index: int) -> Reply:
        reason = self.processes[index].ended()
        self.stop()
        return Reply(fault=reason + self.tag(index), kind="crash")

    def ensure_ready(self) -> Reply | None:
        """Start the worker if needed and wait until JAX is up; return a fault, or None."""
        if not self.started:
            self.spawn()
        if not self.started:
            return Reply(fault=f"could not start a worker: {self.spawn_error}", kind="start")
        if self.ready:
            return None
        reply = self.receive(max(STARTUP_TIMEOUT, self.config.timeout))
        ready = reply.message
        if not reply.fault and not isinstance(ready, Ready):
            kind = ready.KIND if ready is not None else None
            reply = Reply(fault=f"sent a {kind} message, not {Ready.KIND}")
        if reply.fault or not isinstance(ready, Ready):
            return Reply(fault=f"could not start a worker: it {reply.fault}", kind="start")
        self.ready = True
        self.jax = ready.jax
        return None

    def send(self, message: Request) -> int | None:
        """Send `message` to every process; return the index of one that is gone, or None."""
        data = encode(message).encode()
        for i, process in enumerate(self.processes):
            if not process.send(data):
                return i
        return None

    def request(self, message: Request, timeout: float) -> Reply:
        """Send one request and return the reply (or the fault)."""
        fault = self.ensure_ready()
        if fault is not None:
            self.stop()
            return fault
        gone = self.send(dataclasses.replace(message, timeout=timeout))
        if gone is not None:
            return self.died(gone)
        reply = self.receive(timeout)
        if reply.kind == "timeout":
            return slow_outputs(reply, message, self.side)
        if (
            reply.message is not None and reply.message.restart
        ):  # it could not lay back the state a program starts in
            self.stop()
        return reply

    def stop(self) -> None:
        """Kill every process (and whatever they forked); the next request starts a new job."""
        for process in self.processes:
            process.stop()
        if self.coordinator is not None:
            self.coordinator.close()
            self.coordinator = None
        self.started = False
        self.ready = False


def slow_outputs(reply: Reply, message: Request, side: str) -> Reply:
    """Return a timeout that came after the code returned as what it is: slow outputs.

    The worker marks each call that returned (`child.runner.ran_marker`); a timeout after that
    went in flattening, saving or comparing what the code returned (a list of a million
    dicts), which says nothing about the code: kind `outputs`, never a failure of the rewrite.
    """
    outputs = getattr(message, "outputs_path", "")
    marker = Path(f"{outputs}.{side}.ran")
    if not outputs or not marker.exists():
        return reply
    seconds = marker.read_text(encoding="utf-8").strip()
    why = (
        f"{reply.fault}, but not in the code, which returned in {seconds} s: reading, saving "
        "and comparing its outputs took the rest (too large an output to compare in time; "
        "raise --timeout or return less)"
    )
    return Reply(fault=why, kind="outputs")


def combine(side: str, replies: list[protocol.Reply]) -> Reply:
    """Return one reply standing for the replies of every process of a job.

    The site holds only if it holds in every process: the first process whose code raised is
    the reply (tagged with its index), else the first whose outputs differ, else process 0's
    reply with the largest errors of all.
    """
    count = len(replies)
    if count == 1 or isinstance(replies[0], Ready):
        return Reply(replies[0])
    raised = [i for i, r in enumerate(replies) if not r.OK]
    differ = [i for i, r in enumerate(replies) if differs(r)]
    if raised or differ:
        first, *rest = raised + differ
        others = [f"process {i}: {'raised' if i in raised else 'outputs differ'}" for i in rest]
        return Reply(tagged(replies[first], first, count, others), process=first, processes=count)
    references = [r.reference if isinstance(r, Ran) else None for r in replies]
    if len(set(references)) > 1:  # each process fell back on its own: nothing coherent ran
        ran = ", ".join(f"process {i}: {ref}" for i, ref in enumerate(references))
        failed = Failed(stage="call", error=f"the processes ran different code ({ran})")
        return Reply(failed, processes=count)
    out = replies[0]
    found = [  # a program-level rewrite's assumption broken in any process (`child.layouts`)
        f"{v} [process {i} of {count}]"
        for i, r in enumerate(replies)
        if isinstance(r, Ran)
        for v in r.layout_violations or []
    ]
    if found and isinstance(out, Ran):
        out = dataclasses.replace(out, layout_violations=found)
    if isinstance(out, Compared | RecordsCompared):
        errors = [r for r in replies if isinstance(r, Compared | RecordsCompared)]
        abs_errs = [float(r.max_abs_err or 0.0) for r in errors]
        rel_errs = [float(r.max_rel_err or 0.0) for r in errors]
        out = dataclasses.replace(
            out,
            max_abs_err=None if out.max_abs_err is None else max(abs_errs),
            max_rel_err=None if out.max_rel_err is None else max(rel_errs),
        )
    return Reply(out, processes=count)


def differs(reply: protocol.Reply) -> bool:
    """Return True if a reply says the outputs differ."""
    return isinstance(reply, Compared | RecordsCompared) and reply.OK and reply.equal is False


def tagged(reply: protocol.Reply, index: int, count: int, others: list[str]) -> protocol.Reply:
    """Return a process's reply with its index in the message that will become the reason."""
    tag = f" [process {index} of {count}" + "".join(f"; {o}" for o in others) + "]"
    if isinstance(reply, Failed):
        return dataclasses.replace(reply, error=f"{reply.error}{tag}")
    if isinstance(reply, Compared | RecordsCompared) and reply.mismatch is not None:
        mismatch = dataclasses.replace(reply.mismatch, why=f"{reply.mismatch.why}{tag}")
        return dataclasses.replace(reply, mismatch=mismatch)
    return reply
