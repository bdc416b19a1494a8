"""Rewrite the removed `jax.device_put_replicated` as `jax.device_put` with a `NamedSharding`.

(Placeholder while the pass is being written: it matches nothing.)
"""

from __future__ import annotations

import re
from typing import ClassVar

from jaxmigrate.model import Safety
from jaxmigrate.passes import Pass


class DevicePutReplicated(Pass):
    """Rewrite the removed `jax.device_put_replicated` as `jax.device_put` with a `NamedSharding`."""

    NAME: ClassVar[str] = "device-put-replicated"
    CODE: ClassVar[str] = "JM104"
    SAFETY: ClassVar[Safety] = Safety.SAFE
    TRIGGER: ClassVar[re.Pattern[str]] = re.compile(r"(?!x)x")
