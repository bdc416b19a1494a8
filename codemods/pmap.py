"""Rewrite `jax.pmap` as `jax.jit(jax.shard_map(...))`.

(Placeholder while the pass is being written: it matches nothing.)
"""

from __future__ import annotations

import re
from typing import ClassVar

from jaxmigrate.model import Safety
from jaxmigrate.passes import Pass


class Pmap(Pass):
    """Rewrite `jax.pmap` as `jax.jit(jax.shard_map(...))`."""

    NAME: ClassVar[str] = "pmap"
    CODE: ClassVar[str] = "JM202"
    SAFETY: ClassVar[Safety] = Safety.UNSAFE
    TRIGGER: ClassVar[re.Pattern[str]] = re.compile(r"(?!x)x")
