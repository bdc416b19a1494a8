"""Rewrite `jax.experimental.pjit.pjit` as `jax.jit`.

## Why
`jax.experimental.pjit.pjit` was merged into `jax.jit` (JAX 0.4.x) and is deprecated (JAX 0.10
warns); its `in_axis_resources=`/`out_axis_resources=` keywords were removed (`TypeError`), and
`jax.jit` takes everything after the function by keyword only. pjit is not a pure alias, though:
it reads the legacy `with mesh:` context, under which a `None` leaf of its shardings means
*replicated* (jit: unspecified) and bare `PartitionSpec`s resolve (jit needs `jax.set_mesh`).

## Before
```python
import jax
import numpy as np
from jax.experimental.pjit import pjit
from jax.sharding import Mesh, PartitionSpec as P

def run(fn, x, y):
    mesh = Mesh(np.array(jax.devices()), ("x",))
    with mesh:
        f = pjit(fn, in_axis_resources=(P("x"), None), out_axis_resources=P("x"))
        return f(x, y)
```

## After
```python
import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

def run(fn, x, y):
    mesh = Mesh(np.array(jax.devices()), ("x",))
    with jax.set_mesh(mesh):
        f = jax.jit(fn, in_shardings=(P("x"), P()), out_shardings=P("x"))
        return f(x, y)
```

## Safety
safe: the call is renamed, `in_axis_resources`/`out_axis_resources` become
`in_shardings`/`out_shardings`, positional shardings (and `static_argnums`) become keywords,
everything else is kept, and the pjit import goes when nothing else uses it.
- Under a legacy `with mesh:` that the with-mesh pass rewrites, literal `None` leaves (in tuples,
  lists, dicts) become `P()`, spelt as the call or module already spells PartitionSpec, and the
  site joins the group `mesh@<line>` of the outermost such `with`, so pjit and `with` rewrites
  are applied together or not at all. A pjit in a function defined inside the `with` joins the
  group too.
- With no legacy mesh in sight (a pjit built at module level and called under `with mesh:`
  elsewhere), the site is unsafe when its shardings hold PartitionSpecs (jit needs
  `jax.set_mesh(mesh)` where it is called; `None` leaves become `P()`, since such a pjit only ran
  under a mesh), computed expressions (`in_shardings=specs`: kept, and `None` leaves inside them
  cannot be translated), or only `None` leaves (kept: pjit left them unspecified without a mesh
  and replicated them under one; values agree, layouts may not).
- Inside `with jax.set_mesh(...)` pjit already saw no legacy mesh: `None` stays `None`.

## Skips
- `*args`/`**kwargs` unpacked into pjit, the function passed by keyword, a keyword `jax.jit`
  lacks (`abstracted_axes=`), more than four positional arguments (their meaning changed
  between pjit versions), an argument given twice, `partial(pjit, ...)` binding positional
  arguments, `pjit(...)` without a function;
- `pjit` used as a value rather than called (`f = pjit if a else b`);
- a pjit under a `with mesh:` that stays legacy: the with-mesh rewrite is suppressed or cannot be
  made (traced function, `as` target), the target JAX lacks `jax.set_mesh`, or the `with` also
  holds a pjit that is skipped (a pjit left under `jax.set_mesh` would lose its mesh, so the
  whole `with` stays as it is);
- a pjit under `jax.set_mesh` nested in a legacy `with mesh:`.
Look-alikes are never touched: t5x's `partitioner.partition(..., in_axis_resources=...)`,
levanter's `named_jit`, a function of the user's own called `pjit`, other libraries' `pjit`.

## Verification
not needed for the rename. Where `None` leaves or the mesh context change, the grouped
with-mesh site is verified by execution; a program using `in_axis_resources=` cannot run on
current JAX, so its reference is the same program with `NamedSharding`s (cookbook case 10).
"""

from __future__ import annotations

import re
from typing import ClassVar

import libcst as cst

from jaxmigrate.model import Safety
from jaxmigrate.toolkit.meshes import MeshFinder

from ._emission import Emission
from ._survey import PJIT, Survey


class Pjit(Emission):
    """Rewrite `jax.experimental.pjit.pjit` as `jax.jit`."""

    NAME: ClassVar[str] = "pjit"
    CODE: ClassVar[str] = "JM103"
    SAFETY: ClassVar[Safety] = Safety.SAFE
    # `jax.jit(in_shardings=...)`: JAX 0.4.2; `None` leaves in them (kept): JAX 0.4.13
    MIN_JAX: ClassVar[tuple[int, int]] = (0, 5)
    REFERENCE: ClassVar[str | None] = "pjit-in-shardings"
    QUALNAMES: ClassVar[tuple[str, ...]] = (PJIT,)
    TRIGGER: ClassVar[re.Pattern[str]] = re.compile(r"pjit\b")

    @classmethod
    def applies_to(cls, source: str) -> bool:
        """The legacy `pjit` can only be reached through a path naming `jax.experimental`."""
        return "experimental" in source and cls.TRIGGER.search(source) is not None

    def visit_Module(self, node: cst.Module) -> None:
        self.meshes = MeshFinder(node, self.resolver)
        survey = Survey(self, self.meshes)
        node.visit(survey)
        self.decisions = survey.finish()
        for decision in self.decisions.values():
            if decision.reason:
                self.skip(decision.node, decision.reason)
