"""Import `Mesh` and `PartitionSpec` from `jax.sharding`, not from their removed homes.

## Why
`jax.experimental.PartitionSpec`, `jax.experimental.maps.Mesh`, `jax.interpreters.pxla.Mesh`,
`jax.interpreters.pxla.PartitionSpec` and `jax.experimental.pjit.PartitionSpec` were aliases kept
while `jax.sharding` (JAX 0.4.1) became their home; they have since been removed, and importing
them raises `ImportError` or `AttributeError` on current JAX.

## Before
```python
from jax.experimental.maps import Mesh
from jax.experimental import PartitionSpec as P
```

## After
```python
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
```

## Safety
safe: the new names are the same objects the old ones aliased.

## Skips
- Star imports (`from jax.experimental.maps import *`): the names they bring are not known.
- Relative imports and names of other libraries, even when spelt the same.

## Verification
not needed: a pure rename of an import location.
"""

from __future__ import annotations

import re
from typing import ClassVar

import libcst as cst

from jaxmigrate.model import Safety
from jaxmigrate.toolkit.names import dotted
from jaxmigrate.toolkit.passes import Pass

MOVED: dict[str, str] = {
    "jax.experimental.PartitionSpec": "jax.sharding.PartitionSpec",
    "jax.experimental.maps.Mesh": "jax.sharding.Mesh",
    "jax.interpreters.pxla.Mesh": "jax.sharding.Mesh",
    "jax.interpreters.pxla.PartitionSpec": "jax.sharding.PartitionSpec",
    "jax.experimental.pjit.PartitionSpec": "jax.sharding.PartitionSpec",
}


def _split(qualname: str) -> tuple[str, str]:
    module, _, obj = qualname.rpartition(".")
    return module, obj


class LegacyImports(Pass):
    """Import `Mesh` and `PartitionSpec` from `jax.sharding`, not from their removed homes."""

    NAME: ClassVar[str] = "legacy-imports"
    CODE: ClassVar[str] = "JM101"
    SAFETY: ClassVar[Safety] = Safety.SAFE
    MIN_JAX: ClassVar[tuple[int, int]] = (0, 4)  # `jax.sharding`: JAX 0.4.1 (0.4.0 was yanked)
    QUALNAMES: ClassVar[tuple[str, ...]] = tuple(MOVED)
    LITERALS: ClassVar[tuple[str, ...]] = ("experimental", "pxla", "maps", "pjit.")
    TRIGGER: ClassVar[re.Pattern[str]] = re.compile(
        # Every way to reach a moved name: an attribute chain, an import naming it (also in
        # parentheses or after a backslash), the legacy modules, or an alias of the package.
        r"\bexperimental\.(PartitionSpec|maps)\b|\bpxla\b|\bmaps\b|\bpjit\.PartitionSpec\b"
        r"|\bexperimental(\.pjit)?\s+import\b[^\n]*\bPartitionSpec\b"
        r"|\bexperimental(\.pjit)?\s+import\s*[(\\]"
        r"|\bimport\s+jax\.experimental\s+as\b|\bfrom\s+jax\s+import\b[^\n]*\bexperimental\b"
    )

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        if len(updated_node.body) != 1 or not isinstance(updated_node.body[0], cst.ImportFrom):
            return updated_node
        node = updated_node.body[0]
        original = original_node.body[0]
        assert isinstance(original, cst.ImportFrom)
        if node.relative or node.module is None:
            return updated_node
        module = dotted(node.module)
        if isinstance(node.names, cst.ImportStar):
            if any(_split(q)[0] == module for q in MOVED):
                self.skip(original, "star import: the names it brings are not known")
            return updated_node
        moved: list[cst.ImportAlias] = []
        kept: list[cst.ImportAlias] = []
        assert not isinstance(original.names, cst.ImportStar)
        for alias, orig_alias in zip(node.names, original.names):
            qualname = f"{module}.{dotted(alias.name)}"
            if qualname in MOVED and self.site(
                orig_alias, f"`{qualname}` moved to `{MOVED[qualname]}`"
            ):
                moved.append(alias.with_changes(name=cst.Name(_split(MOVED[qualname])[1])))
            else:
                kept.append(alias)
        if not moved:
            return updated_node
        target = cst.parse_expression("jax.sharding")
        assert isinstance(target, cst.Attribute)
        if not kept:
            return updated_node.with_changes(
                body=[node.with_changes(module=target, names=_strip_last_comma(moved))]
            )
        new_line = cst.SimpleStatementLine(
            body=[cst.ImportFrom(module=target, names=_strip_last_comma(moved))]
        )
        first = updated_node.with_changes(body=[node.with_changes(names=_strip_last_comma(kept))])
        return cst.FlattenSentinel([first, new_line])

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        qualname = self.qualname(original_node)
        if qualname not in MOVED:
            return updated_node
        if not self.site(original_node, f"`{qualname}` moved to `{MOVED[qualname]}`"):
            return updated_node
        base = dotted(original_node.value)
        if base is not None:
            self.drop_import_if_unused(base.split(".")[0] if "." not in base else base)
        return self.jax_attr(MOVED[qualname].removeprefix("jax."))


def _strip_last_comma(aliases: list[cst.ImportAlias]) -> list[cst.ImportAlias]:
    if aliases and not isinstance(aliases[-1].comma, cst.MaybeSentinel):
        aliases = [*aliases[:-1], aliases[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)]
    return aliases
