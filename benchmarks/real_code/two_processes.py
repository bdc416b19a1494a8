"""Run a script as the 2 processes of one JAX job on this machine (4 CPU devices each, gloo),
as a multi-host job runs it; write each process's standard output to OUT.0 and OUT.1.

    python two_processes.py OUT PORT script.py [ARGS...]

The script runs as `__main__` in the current folder, after `jax.distributed.initialize`.
"""

import os
import subprocess
import sys

out, port, script, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
BOOT = """
import os, runpy, sys
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(
    "localhost:" + os.environ["PORT"], num_processes=2, process_id=int(os.environ["PROCESS"])
)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
procs = []
for i in range(2):
    env = dict(
        os.environ,
        PORT=port,
        PROCESS=str(i),
        XLA_FLAGS="--xla_force_host_platform_device_count=4",
    )
    with open(f"{out}.{i}", "w") as stdout, open(f"{out}.{i}.err", "w") as stderr:
        command = [sys.executable, "-c", BOOT, script, *args]
        procs.append(subprocess.Popen(command, env=env, stdout=stdout, stderr=stderr))
codes = [p.wait() for p in procs]
print("exit codes", codes)
sys.exit(max(codes))
