"""The passes, one module each, in the one order they run.

Order matters: a rename can create the input of a later pass. Import moves run first, so later
passes see `jax.sharding`; the experimental shard_map rename runs before anything that reads
`jax.shard_map`; host_callback calls become `io_callback` before the partial-auto callback pass
looks for callbacks, which runs before the per-shard callback pass (it skips callbacks already in a
shard_map); pjit runs before `with mesh:`, whose rewrite is grouped with the pjit sites it
encloses, and before the per-shard callback pass, which reads `jax.jit`. pmap runs last: it reads
the removed `device_put_replicated` rewritten (`jax.device_put` of stacked copies, a row of its
layout table) as the replication it is, and its program-level form deletes it; the original
with the safe rewrites alone is then what verification runs where the original cannot. A meta-test fails when
a module here is missing from `PASSES`.
"""

from __future__ import annotations

from jaxmigrate.toolkit.passes import Pass

from .device_put_replicated import DevicePutReplicated
from .device_put_sharded import DevicePutSharded
from .experimental_shard_map import ExperimentalShardMap
from .host_callback import HostCallback
from .jit_callback_per_shard import JitCallbackPerShard
from .legacy_imports import LegacyImports
from .partial_auto_callback import PartialAutoCallback
from .pjit import Pjit
from .pmap import Pmap
from .with_mesh import WithMesh

PASSES: tuple[type[Pass], ...] = (
    LegacyImports,
    ExperimentalShardMap,
    HostCallback,
    PartialAutoCallback,
    Pjit,
    WithMesh,
    JitCallbackPerShard,
    DevicePutReplicated,
    DevicePutSharded,
    Pmap,
)

__all__ = ["PASSES"]
