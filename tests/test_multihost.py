"""The multi-process test harness (tests/multihost.py), and multi-host pmap semantics with it.

The pmap job is the reference every multi-host migration must match: a 2-process job with 4 CPU
devices per process, where each process feeds its own local (4, ...) blocks, and a `pmean`
averages over all 8 devices of the job.
"""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from multihost import run_code

from jaxmigrate.verify.processes import Coordinator

PMAP_JOB = """
from functools import partial
import jax, numpy as np
from jax import lax

assert (jax.process_count(), jax.device_count(), jax.local_device_count()) == (2, 8, 4)
jax.distributed.initialize("localhost:1", num_processes=2, process_id=0)  # the program's own: a no-op

@partial(jax.pmap, axis_name="i")
def step(x):
    return lax.pmean(x, "i"), lax.axis_index("i"), x

i = jax.process_index()
mean, index, same = step(np.arange(4.0, dtype=np.float32) + 4 * i)
print("shape", mean.shape, "mean", np.asarray(mean).tolist())
print("index", np.asarray(index).tolist(), "same", np.asarray(same).tolist())
"""


@pytest.mark.jax
def test_pmap_collectives_span_every_process_and_results_stay_local() -> None:
    job = run_code(PMAP_JOB, processes=2, devices=8, timeout=120).check()
    for i, out in enumerate(job.stdouts):
        assert "shape (4,) mean [3.5, 3.5, 3.5, 3.5]" in out  # mean of 0..7: all 8 devices
        local = [4.0 * i + k for k in range(4)]
        # the axis index is global (process 1 holds devices 4..7), the results are local blocks
        assert f"index {[4 * i + k for k in range(4)]} same {local}" in out


def test_a_failed_process_stops_the_job_and_names_its_exit() -> None:
    code = (
        "import os, sys, time\n"
        "if os.environ['JAXMIGRATE_PROCESS_ID'] == '1':\n"
        "    print('bad input', file=sys.stderr)\n"
        "    sys.exit(3)\n"
        "time.sleep(60)\n"
    )
    started = time.monotonic()
    job = run_code(code, join=False, timeout=60, grace=0.5)
    assert time.monotonic() - started < 30  # the peer was killed, not waited for
    assert not job.ok and not job.timed_out
    assert [p.returncode for p in job.processes] == [None, 3]
    assert "bad input" in job.processes[1].stderr
    with pytest.raises(AssertionError, match="process 1: exit 3"):
        job.check()


def test_a_job_that_hangs_is_killed_at_its_timeout() -> None:
    job = run_code("import time\ntime.sleep(60)\n", join=False, timeout=1)
    assert job.timed_out and not job.ok
    assert [p.returncode for p in job.processes] == [None, None]


def test_each_process_gets_its_share_of_the_devices_and_the_job() -> None:
    code = "import os\nprint(os.environ['XLA_FLAGS'], os.environ['JAXMIGRATE_PROCESS_ID'])\n"
    job = run_code(code, join=False, processes=4, devices=8).check()
    assert [out.split()[-2:] for out in job.stdouts] == [
        ["--xla_force_host_platform_device_count=2", str(i)] for i in range(4)
    ]
    with pytest.raises(ValueError, match="cannot be split evenly between 3 processes"):
        run_code(code, join=False, processes=3, devices=8)


def test_a_held_coordinator_port_is_not_handed_to_another_job() -> None:
    """The port of a job's coordinator stays bound until the job ends: a port found free and let
    go was once handed to a second job starting meanwhile, whose process joined the first's
    coordinator ("tried to connect with a different incarnation")."""
    with Coordinator() as held:
        port = int(held.address.rsplit(":", 1)[1])
        with socket.socket() as plain, pytest.raises(OSError):  # taken for a plain bind
            plain.bind(("localhost", port))
        others = []
        for _ in range(300):  # what the next jobs are given, while this one runs
            with Coordinator() as other:
                others.append(int(other.address.rsplit(":", 1)[1]))
        assert port not in others
    with socket.socket() as plain:  # let go when the job ends
        plain.bind(("localhost", port))


@pytest.mark.jax
def test_jobs_started_together_each_join_their_own_coordinator() -> None:
    code = "import jax; print('job', jax.process_count(), jax.device_count())"
    with ThreadPoolExecutor(3) as pool:
        jobs = list(
            pool.map(lambda _: run_code(code, processes=2, devices=4, timeout=120), range(3))
        )
    addresses = {job.coordinator for job in jobs}
    assert len(addresses) == 3, addresses
    for job in jobs:
        assert all("job 2 4" in out for out in job.check().stdouts)
