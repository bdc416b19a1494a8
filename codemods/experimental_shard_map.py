"""Rewrite `jax.experimental.shard_map.shard_map` as `jax.shard_map`.

(Placeholder while the pass is being written: it matches nothing.)
"""

from __future__ import annotations

import re
from typing import ClassVar

from jaxmigrate.model import Safety
from jaxmigrate.passes import Pass


class ExperimentalShardMap(Pass):
    """Rewrite `jax.experimental.shard_map.shard_map` as `jax.shard_map`."""

    NAME: ClassVar[str] = "experimental-shard-map"
    CODE: ClassVar[str] = "JM102"
    SAFETY: ClassVar[Safety] = Safety.SAFE
    TRIGGER: ClassVar[re.Pattern[str]] = re.compile(r"(?!x)x")
