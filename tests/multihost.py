"""Run a Python script as an N-process JAX job on this machine (a simulated multi-host job).

    from multihost import run_code, run_job    # tests/ is on sys.path (tests/conftest.py)

    job = run_job("train.py", processes=2, devices=8, timeout=120).check()
    job.stdouts            # ["w [0.1 ...]\n", "w [0.1 ...]\n"], by process index
    job.processes[1].stderr

Each process gets `devices / processes` CPU devices (`--xla_force_host_platform_device_count`),
`JAX_PLATFORMS=cpu`, and, before the script runs, joins the job:
`jax.config.update("jax_cpu_collectives_implementation", "gloo")` then
`jax.distributed.initialize("localhost:PORT", num_processes=N, process_id=i)` on a free port (the
code is jaxmigrate's own, `jaxmigrate.verify.child.distributed.join`, which the verifier's
workers use too). The script's own later `jax.distributed.initialize(...)` calls do nothing, so a
real multi-host program runs unchanged. With `join=False` the script must join by itself; the
variables JAXMIGRATE_PROCESS_ID, JAXMIGRATE_NUM_PROCESSES and JAXMIGRATE_COORDINATOR tell it how.

The script runs as `__main__` with `sys.argv = [script, *args]`, in `cwd`. Every process is
killed (its whole session) when the job times out, and `grace` seconds after one process failed
(its peers would wait for it in their collectives forever); killed processes have
`returncode=None`. Output goes through files, so a chatty process cannot block on a pipe.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from jaxmigrate.verify.processes import Coordinator, process_env, wait_all

BOOT = """\
import os, runpy, sys
if {join!r}:
    from jaxmigrate.verify.child.distributed import join
    join()
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as exc:
    if exc.code not in (0, None):  # exit now: a normal exit waits for the job's peers
        print(exc.code if not isinstance(exc.code, int) else "", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(exc.code if isinstance(exc.code, int) else 1)
    raise
"""


@dataclass(frozen=True)
class ProcessOutput:
    """What one process of a job did: its exit code (None: killed) and its output."""

    index: int
    returncode: int | None
    stdout: str
    stderr: str


@dataclass(frozen=True)
class JobResult:
    """Every process's output, by process index, and whether the job ran out of time."""

    processes: tuple[ProcessOutput, ...]
    timed_out: bool
    coordinator: str

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(p.returncode == 0 for p in self.processes)

    @property
    def stdouts(self) -> list[str]:
        return [p.stdout for p in self.processes]

    def describe(self) -> str:
        """Return every process's exit code and the tail of its output, for failure messages."""
        head = "timed out\n" if self.timed_out else ""
        return head + "\n".join(
            f"--- process {p.index}: exit {p.returncode}\n{p.stdout[-2000:]}{p.stderr[-4000:]}"
            for p in self.processes
        )

    def check(self) -> JobResult:
        """Return self if every process exited 0 in time; raise AssertionError otherwise."""
        if not self.ok:
            raise AssertionError(f"the multi-process job failed:\n{self.describe()}")
        return self


def run_job(
    script: str | Path,
    *,
    processes: int = 2,
    devices: int = 8,
    timeout: float = 120.0,
    args: Sequence[str] = (),
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    python: str = sys.executable,
    join: bool = True,
    grace: float = 10.0,
) -> JobResult:
    """Run `script` as a `processes`-process JAX job over `devices` devices in all."""
    with Coordinator() as held:  # its port held until the job ends
        coordinator = held.address
        base = dict(os.environ if env is None else env)
        boot = BOOT.format(join=join)
        with tempfile.TemporaryDirectory(prefix="multihost-") as logs:
            outs = [Path(logs, f"{i}.out") for i in range(processes)]
            errs = [Path(logs, f"{i}.err") for i in range(processes)]
            procs = []
            try:
                for i in range(processes):
                    with outs[i].open("wb") as out, errs[i].open("wb") as err:
                        procs.append(
                            subprocess.Popen(
                                [python, "-c", boot, str(script), *args],
                                cwd=cwd,
                                env=process_env(base, i, processes, devices, coordinator),
                                stdin=subprocess.DEVNULL,
                                stdout=out,
                                stderr=err,
                                start_new_session=True,
                            )
                        )
                codes = wait_all(procs, timeout, grace)
            finally:
                for proc in procs:
                    kill(proc)
            results = tuple(
                ProcessOutput(i, codes[i], read(outs[i]), read(errs[i])) for i in range(processes)
            )
        timed_out = any(c is None for c in codes) and not any(c not in (0, None) for c in codes)
        return JobResult(results, timed_out, coordinator)


def run_code(code: str, **kwargs: object) -> JobResult:
    """Run the Python source `code` as a job (see run_job for the keyword arguments)."""
    with tempfile.TemporaryDirectory(prefix="multihost-script-") as folder:
        script = Path(folder, "job.py")
        script.write_text(code, encoding="utf-8")
        return run_job(script, **kwargs)  # type: ignore[arg-type]


def kill(proc: subprocess.Popen[bytes]) -> None:
    """Kill a process and everything in its session, then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def read(path: Path) -> str:
    return path.read_bytes().decode(errors="replace")
