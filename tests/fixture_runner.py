"""Run fixture modules' `main()` (or `reference()`) in this process and pickle the outputs.

Usage: python fixture_runner.py OUT.pkl FILE[:FUNC] ...  -- each file runs as its own module;
an exception is recorded as the result instead of stopping the batch.
"""

from __future__ import annotations

import pickle
import runpy
import sys
import traceback


def to_host(tree):
    import jax
    import numpy as np

    def leaf(x):
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            return ("prng_key", np.asarray(jax.random.key_data(x)))
        if isinstance(x, (jax.Array, np.ndarray, np.generic)):
            x.block_until_ready() if isinstance(x, jax.Array) else None
            return np.asarray(x)
        return x

    return jax.tree.map(leaf, tree)


def main(argv: list[str]) -> None:
    out_path, specs = argv[0], argv[1:]
    results = {}
    for spec in specs:
        path, _, func = spec.partition(":")
        try:
            namespace = runpy.run_path(path, run_name="__fixture__")
            fn = namespace[func or "main"]
            results[spec] = ("ok", to_host(fn()))
        except BaseException as exc:  # noqa: BLE001 - recorded for the test to report
            results[spec] = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    with open(out_path, "wb") as handle:
        pickle.dump(results, handle)


if __name__ == "__main__":
    main(sys.argv[1:])
