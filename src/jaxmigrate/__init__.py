"""jaxmigrate: move JAX code off its legacy parallel APIs, and prove each rewrite by running it.

The Python API for editors and other tools::

    from jaxmigrate import migrate_source
    result = migrate_source(code)          # -> Migration(code, sites, skips)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jaxmigrate._version import __version__

__all__ = ["Migration", "Options", "__version__", "migrate_source"]

if TYPE_CHECKING:
    from jaxmigrate.model import Options
    from jaxmigrate.pipeline.engine import Migration, migrate_source


def __getattr__(name: str) -> Any:
    if name in {"Migration", "Options", "migrate_source"}:
        from jaxmigrate.pipeline import engine

        return getattr(engine, name)
    raise AttributeError(name)
