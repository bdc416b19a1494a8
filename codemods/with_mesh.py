"""Rewrite a legacy `with mesh:` context as `with jax.set_mesh(mesh):`.

(Placeholder while the pass is being written: it matches nothing.)
"""

from __future__ import annotations

import re
from typing import ClassVar

from jaxmigrate.model import Safety
from jaxmigrate.passes import Pass


class WithMesh(Pass):
    """Rewrite a legacy `with mesh:` context as `with jax.set_mesh(mesh):`."""

    NAME: ClassVar[str] = "with-mesh"
    CODE: ClassVar[str] = "JM201"
    SAFETY: ClassVar[Safety] = Safety.UNSAFE
    TRIGGER: ClassVar[re.Pattern[str]] = re.compile(r"(?!x)x")
