"""Amortised cost of verifying pmap sites, and how it scales with sites and workers.

    python benchmarks/verify_cost.py [--sites 20] [--files 4] [--processes N]

Builds a project of SITES decorated `jax.pmap` sites (varied bodies: elementwise, collectives,
reductions, pytrees) spread over FILES modules, the faithful `jax.jit(jax.shard_map(...))` rewrite
of each, and a script that calls every site 3 times. Then times `verify()`:

  1. recorded inputs (`--verify-with` the script) for SITES sites, 1 worker pair;
  2. declared inputs (`__jaxmigrate_examples__`, no command to run) for SITES/4, SITES/2 and
     SITES sites, 1 worker pair: how the cost scales with the number of sites;
  3. declared inputs for SITES sites with 1 and 2 worker pairs: how it scales with workers.

With `--processes N` (N > 1) it measures multi-process verification instead: recorded and
declared inputs for SITES sites, 1 worker pair, as 1-process and as N-process jobs, on a
multi-host-correct rewrite (a mesh over every device of the job, each process's local blocks
made global with `multihost_utils`), with each process's data its own.

Each line gives the wall time, the amortised seconds per site and the statuses. The goal is
under 1.5 s per site amortised with recorded inputs. Nothing outside a temporary directory is
written.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import textwrap
import time
from collections import Counter
from pathlib import Path

from jaxmigrate.model import Safety, Site
from jaxmigrate.verify import VerifyConfig, VerifyRequest, verify

HEADER = """\
from functools import partial

from jax.experimental import multihost_utils

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, PartitionSpec as P
"""
BODIES = [
    "x * 2 + 1",
    "jnp.tanh(x) * x",
    'lax.psum(x, "i")',
    'lax.pmean(x, "i") - x',
    'lax.pmax(x, "i")',
    'x / x.shape[0] + lax.axis_index("i")',
    "x - x.mean()",
    'jax.nn.softmax(x, axis=0) * lax.psum(1, "i")',
    'lax.all_gather(x, "i").sum(0)',
    'lax.ppermute(x, "i", [(j, (j + 1) % 8) for j in range(8)])',
    "jnp.outer(x, x).sum(1)",
    'jnp.cumsum(x) + lax.pmin(x, "i")',
]


def body(k: int) -> str:
    return f"{BODIES[k % len(BODIES)]} + {k}"


# each process's own block of the global (8, 4) input: (local devices, 4)
LOCAL_X = (
    "np.arange(32, dtype=np.float32).reshape(8, 4)[jax.process_index() * jax.local_device_count()"
    " :][: jax.local_device_count()] / 7"
)


def examples_table(sites: range) -> str:
    names = ", ".join(f'"step_{k}": [(X,)]' for k in sites)
    return f"X = {LOCAL_X}\n__jaxmigrate_examples__ = {{{names}}}\n"


def original(sites: range, examples: bool) -> str:
    parts = [HEADER]
    if examples:
        parts.append(examples_table(sites))
    for k in sites:
        parts.append(
            f'\n\n@partial(jax.pmap, axis_name="i")\ndef step_{k}(x):\n    return {body(k)}\n'
        )
    return "".join(parts)


GLOBAL_STEP = """

_global_{k} = jax.jit(jax.shard_map(_body_{k}, mesh=mesh, in_specs=P("i"), out_specs=P("i")))


def step_{k}(x):
    x = multihost_utils.host_local_array_to_global_array(x, mesh, P("i"))
    return multihost_utils.global_array_to_host_local_array(_global_{k}(x), mesh, P("i"))
"""


def rewritten(sites: range, examples: bool, global_arrays: bool = False) -> str:
    """The faithful rewrite; with `global_arrays`, its multi-host-correct form."""
    parts = [HEADER]
    if examples:
        parts.append(examples_table(sites))
    parts.append('mesh = Mesh(np.array(jax.devices()[:8]), ("i",))\n')
    for k in sites:
        parts.append(
            textwrap.dedent(f"""

            def _body_{k}(x):
                x = jnp.squeeze(x, 0)
                return jnp.expand_dims({body(k)}, 0)


            step_{k} = jax.jit(jax.shard_map(_body_{k}, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
            """)
        )
        if global_arrays:
            parts[-1] = parts[-1].split("\n\nstep_")[0] + GLOBAL_STEP.format(k=k)
    return "".join(parts)


def site_lines(text: str) -> list[int]:
    return [i for i, line in enumerate(text.splitlines(), 1) if line.startswith("@partial")]


def build(
    root: Path, count: int, files: int, examples: bool, global_arrays: bool = False
) -> list[VerifyRequest]:
    """Write the project; return one request per module."""
    root.mkdir(parents=True)
    requests, calls = [], []
    per_file = -(-count // files)
    for f in range(files):
        sites = range(f * per_file, min(count, (f + 1) * per_file))
        if not sites:
            break
        old, new = original(sites, examples), rewritten(sites, examples, global_arrays)
        (root / f"steps_{f}.py").write_text(old)
        found = tuple(
            Site("JM202", "pmap", line, 1, Safety.UNSAFE, "pmap", key=f"JM202:{line}:1")
            for line in site_lines(old)
        )
        requests.append(VerifyRequest(f"steps_{f}.py", old, new, found))
        calls += [f"    for i in range(3):\n        steps_{f}.step_{k}(x + i)\n" for k in sites]
    imports = "".join(f"import steps_{f}\n" for f in range(len(requests)))
    script = "import jax\nimport numpy as np\n" + imports + "\n\ndef main():\n"
    script += f"    x = {LOCAL_X}\n" + "".join(calls)
    (root / "run_all.py").write_text(script + "\n\nmain()\n")
    return requests


def measure(
    label: str, count: int, files: int, jobs: int, recorded: bool, processes: int = 0
) -> float:
    """Verify `count` sites once; print and return the amortised seconds per site.

    `processes` > 0: as a job of that many processes, on the multi-host-correct rewrite.
    """
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "project"
        requests = build(root, count, files, examples=not recorded, global_arrays=processes > 0)
        config = VerifyConfig(
            root=root,
            jobs=jobs,
            verify_with=f"{sys.executable} run_all.py" if recorded else None,
            synthesize=False,
            processes=max(1, processes),
        )
        start = time.perf_counter()
        verdicts = verify(requests, config)
        elapsed = time.perf_counter() - start
    statuses = Counter(str(v.status) for v in verdicts.values())
    notes = {v.details["verify_with"] for v in verdicts.values() if "verify_with" in v.details}
    sources = Counter(v.details.get("input_source", "-") for v in verdicts.values())
    per_site = elapsed / count
    print(
        f"{label:<34} sites={count:>3} jobs={jobs}{f' processes={processes}' if processes else ''}"
        f"  {elapsed:6.1f} s  {per_site:5.2f} s/site  "
        f"{dict(statuses)} {dict(sources)}",
        flush=True,
    )
    for note in notes:
        print(f"{'':<34} (of which recording: {note})")
    return per_site


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--sites", type=int, default=20)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--processes", type=int, default=1)
    args = parser.parse_args()
    n, files = args.sites, args.files
    if args.processes > 1:
        compare_processes(n, files, args.processes)
        return
    headline = measure("recorded (--verify-with)", n, files, 1, recorded=True)
    for count in sorted({max(1, n // 4), max(1, n // 2), n}):
        measure("declared, scaling with sites", count, min(files, count), 1, recorded=False)
    for jobs in (1, 2):
        measure("declared, scaling with workers", n, files, jobs, recorded=False)
    verdict = "meets" if headline < 1.5 else "misses"
    print(f"\nrecorded inputs: {headline:.2f} s/site amortised ({verdict} the 1.5 s/site goal)")


def compare_processes(n: int, files: int, processes: int) -> None:
    """Print the cost of N-process verification next to 1-process, on the same rewrite."""
    costs = {}
    for recorded in (True, False):
        label = "recorded (--verify-with)" if recorded else "declared"
        for count in (1, processes):
            costs[recorded, count] = measure(label, n, files, 1, recorded, processes=count)
    for recorded in (True, False):
        one, many = costs[recorded, 1], costs[recorded, processes]
        kind = "recorded" if recorded else "declared"
        print(
            f"{kind}: {many:.2f} s/site with {processes} processes, {one:.2f} with 1 ({many / one:.1f}x)"
        )


if __name__ == "__main__":
    main()
