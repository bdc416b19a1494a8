"""Multi-process JAX jobs on this machine: the environment each process of an N-process job gets.

A job of N processes simulates N hosts: each process has `devices / N` CPU devices
(`--xla_force_host_platform_device_count`), and joins the job before any other JAX use with
`jax.config.update("jax_cpu_collectives_implementation", "gloo")` and
`jax.distributed.initialize(COORDINATOR, num_processes=N, process_id=i)`. The joining is done
on the child side (`child/distributed.py`), from the variables below; this module only chooses
the coordinator's port and writes the environment.
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Self

PROCESS_ID = "JAXMIGRATE_PROCESS_ID"
NUM_PROCESSES = "JAXMIGRATE_NUM_PROCESSES"
COORDINATOR = "JAXMIGRATE_COORDINATOR"
DEVICE_FLAG = "--xla_force_host_platform_device_count"
GRACE = 10.0  # seconds the peers of a failed process get to finish before they are killed


class DeviceSplitError(ValueError):
    """The devices cannot be split evenly between the processes."""


def devices_per_process(devices: int, processes: int) -> int:
    """Return each process's share of `devices`; raise DeviceSplitError if it is not whole."""
    if processes < 1 or devices % processes:
        raise DeviceSplitError(
            f"--devices {devices} cannot be split evenly between {processes} processes "
            f"(choose a multiple of {processes})"
        )
    return devices // processes


def with_devices(env: Mapping[str, str], count: int) -> dict[str, str]:
    """Return `env` with XLA_FLAGS simulating `count` CPU devices and JAX on the CPU only."""
    out = dict(env)
    flags = [f for f in out.get("XLA_FLAGS", "").split() if not f.startswith(DEVICE_FLAG)]
    out["XLA_FLAGS"] = " ".join([*flags, f"{DEVICE_FLAG}={count}"])
    out["JAX_PLATFORMS"] = "cpu"
    return out


def process_env(
    env: Mapping[str, str], index: int, processes: int, devices: int, coordinator: str
) -> dict[str, str]:
    """Return the environment of process `index` of a job over `devices` devices in all.

    A one-process job gets the devices and no job variables: it does not call
    `jax.distributed.initialize`, exactly as before multi-process verification existed.
    """
    out = with_devices(env, devices_per_process(devices, processes))
    for name in (PROCESS_ID, NUM_PROCESSES, COORDINATOR):
        out.pop(name, None)
    if processes > 1:
        out.update(
            {PROCESS_ID: str(index), NUM_PROCESSES: str(processes), COORDINATOR: coordinator}
        )
    return out


class Coordinator:
    """The coordinator address of one JAX job, its port held until `close()`.

    A port found free and let go could be handed to another job starting meanwhile (CI runs
    many 2-process jobs at once): two coordinators then bind it (gRPC sets SO_REUSEPORT) and
    one job's process joins the other's ("tried to connect with a different incarnation").
    The port is held by a socket bound with SO_REUSEPORT that never listens: the job's
    coordinator binds it beside that socket, and no `bind(("localhost", 0))` on this machine is
    given it while it is held (the kernel picks a port no socket is bound to).
    """

    def __init__(self) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        self._socket.bind(("localhost", 0))
        self.address = f"localhost:{self._socket.getsockname()[1]}"

    def close(self) -> None:
        self._socket.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def wait_all(
    procs: Sequence[subprocess.Popen[bytes]], timeout: float, grace: float = GRACE
) -> list[int | None]:
    """Wait for every process of a job; return their exit codes (None: still running).

    Waiting stops at `timeout`, or `grace` seconds after a process failed: its peers may be
    blocked in a collective that will never complete. The caller kills what still runs.
    """
    deadline = time.monotonic() + timeout
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes) or time.monotonic() >= deadline:
            return codes
        if any(c not in (0, None) for c in codes):
            deadline = min(deadline, time.monotonic() + grace)
        time.sleep(0.05)


MULTI_PROCESS_API = re.compile(r"\b(process_index|process_count)\b|\bjax\.(distributed)\b")


def processes_hint(text: str, processes: int) -> str:
    """Return a hint to verify with `--processes 2` when `text` uses multi-process JAX APIs.

    Such code behaves differently in each process of a multi-host job, and a one-process
    verification cannot show it; '' when already verified with several processes.
    """
    if processes > 1:
        return ""
    found = MULTI_PROCESS_API.search(text)
    if found is None:
        return ""
    api = f"jax.{found.group(1) or found.group(2)}"
    return f"the code calls {api}: verify it as a multi-process job too (--processes 2)"
