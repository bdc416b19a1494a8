"""Hand-written original/rewrite pairs for the verifier, and a helper to verify them in bulk.

Each case is one module: the original marks its site's line with `# SITE`. Cases are written to
one project and verified in one `verify()` call, so JAX starts once per worker for all of them.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

from jaxmigrate.model import Safety, Site, Status
from jaxmigrate.verify import Verdict, VerifyConfig, VerifyRequest, verify

HEADER = """\
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
"""
MESH = 'mesh = Mesh(np.array(jax.devices()[:8]), ("i",))\n'


def block(body: str, indent: str = "    ") -> str:
    """Return `body` dedented, stripped of blank edges and indented by `indent`."""
    return textwrap.indent(textwrap.dedent(body).strip("\n"), indent)


def pmapped(body: str, args: str = 'axis_name="i"', params: str = "x") -> str:
    """Return a module defining `step` as a decorated pmap of `body`."""
    return f"{HEADER}\n\n@partial(jax.pmap, {args})  # SITE\ndef step({params}):\n{block(body)}\n"


def faithful(
    body: str, in_specs: str = 'P("i")', out_specs: str = 'P("i")', extra: str = ""
) -> str:
    """Return `step` as jit(shard_map) of `body(x)`, squeezing and expanding axis 0."""
    return (
        f"{HEADER}{MESH}\n\ndef _body(x):\n{block(body)}\n\n\n"
        "def _faithful(x):\n    return jnp.expand_dims(_body(jnp.squeeze(x, 0)), 0)\n\n\n"
        f"step = jax.jit(jax.shard_map(_faithful, mesh=mesh, in_specs={in_specs}, "
        f"out_specs={out_specs}{extra}))\n"
    )


def idiomatic(body: str) -> str:
    """Return `step` as jit(shard_map) of the unchanged `body(x)` with P("i") specs."""
    return (
        f"{HEADER}{MESH}\n\ndef _body(x):\n{block(body)}\n\n\n"
        'step = jax.jit(jax.shard_map(_body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))\n'
    )


def module(text: str) -> str:
    """Return HEADER followed by `text` dedented."""
    return f"{HEADER}\n{textwrap.dedent(text).lstrip()}"


@dataclass(frozen=True)
class Case:
    """One site: original and rewritten module texts, and what the verifier must say."""

    name: str
    original: str
    candidate: str
    expect: Status
    reason: str = ""
    site_name: str = "pmap"
    reference: str = "original"
    baseline: str | None = None
    alternative: str | None = None

    @property
    def path(self) -> str:
        return f"{self.name}.py"

    def site(self) -> Site:
        line = next(i for i, t in enumerate(self.original.splitlines(), 1) if "# SITE" in t)
        return Site(
            "JM200", self.site_name, line, 1, Safety.UNSAFE, self.name, key=f"{self.name}:{line}"
        )

    def request(self) -> VerifyRequest:
        site = self.site()
        alternatives = {site.key: self.alternative} if self.alternative else {}
        return VerifyRequest(
            self.path,
            self.original,
            self.candidate,
            (site,),
            baseline=self.baseline,
            alternatives=alternatives,
        )


def verify_cases(cases: list[Case], root: Path, **config: object) -> dict[str, Verdict]:
    """Write the originals under `root`, verify every case in one run, return verdicts by name."""
    root.mkdir(parents=True, exist_ok=True)
    for case in cases:
        (root / case.path).write_text(case.original)
    settings = {"timeout": 60.0, "jobs": 1} | config
    verdicts = verify([c.request() for c in cases], VerifyConfig(root=root, **settings))  # type: ignore[arg-type]
    return {c.name: verdicts[(c.path, c.site().key)] for c in cases}


def tree_digest(root: Path) -> dict[str, bytes]:
    """Return every file under `root` with its bytes (to show nothing was written)."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }
