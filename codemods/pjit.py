"""Rewrite `jax.experimental.pjit.pjit` as `jax.jit`.

(Placeholder while the pass is being written: it matches nothing.)
"""

from __future__ import annotations

import re
from typing import ClassVar

from jaxmigrate.model import Safety
from jaxmigrate.passes import Pass


class Pjit(Pass):
    """Rewrite `jax.experimental.pjit.pjit` as `jax.jit`."""

    NAME: ClassVar[str] = "pjit"
    CODE: ClassVar[str] = "JM103"
    SAFETY: ClassVar[Safety] = Safety.SAFE
    TRIGGER: ClassVar[re.Pattern[str]] = re.compile(r"(?!x)x")
