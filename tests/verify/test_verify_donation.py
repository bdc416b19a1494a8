"""Reading a value during verification must not change what the program does with it.

On the CPU, `np.asarray(jax_array)` is a view of the device buffer, and a buffer in use is not
donated: JAX copies instead. A verifier that kept such views would let a rewrite that donates an
array the program reads again run cleanly under verification, and raise ("Array has been
deleted") once written. Each reader the verifier uses on a program's values is checked here on a
real donation.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.jax

SCRIPT = textwrap.dedent("""
    import sys

    import jax
    import jax.numpy as jnp

    from jaxmigrate.verify.child import hostify, layouts

    readers = {
        "on_host": layouts.on_host,
        "flatten_replicated": lambda x: layouts.flatten(x[None], "replicated"),
        "differs": layouts.differs,
        "leaf_to_host": hostify.leaf_to_host,
        "output_leaf": hostify.output_leaf,
        "nothing": lambda x: None,
    }
    read = readers[sys.argv[1]]
    step = jax.jit(lambda p: p * 2, donate_argnums=(0,))
    params = jnp.ones((3, 2))
    kept = read(params)  # what the verifier holds on to while the program runs
    step(params)
    try:
        (params - 1).block_until_ready()
    except RuntimeError as error:
        print("deleted" if "deleted" in str(error) else error)
    else:
        print("still readable")
""")


@pytest.mark.parametrize(
    "reader",
    ["on_host", "flatten_replicated", "differs", "leaf_to_host", "output_leaf", "nothing"],
)
def test_a_value_the_verifier_read_is_still_donated(reader: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, reader], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "deleted", (reader, proc.stdout, proc.stderr[-2000:])
