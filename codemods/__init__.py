"""The passes, one module each, in the one order they run.

Order matters: a rename can create the input of a later pass. Import moves run first, so later
passes see `jax.sharding`; the experimental shard_map rename runs before anything that reads
`jax.shard_map`; host_callback calls become `io_callback` before the partial-auto callback pass
looks for callbacks, which runs before the per-shard callback pass (it skips callbacks already in a
shard_map); pjit runs before `with mesh:`, whose rewrite is grouped with the pjit sites it
encloses, and before the per-shard callback pass, which reads `jax.jit`. A meta-test fails when
a module here is missing from `PASSES`.
"""

from __future__ import annotations

from jaxmigrate.codemods.device_put_replicated import DevicePutReplicated
from jaxmigrate.codemods.device_put_sharded import DevicePutSharded
from jaxmigrate.codemods.experimental_shard_map import ExperimentalShardMap
from jaxmigrate.codemods.host_callback import HostCallback
from jaxmigrate.codemods.jit_callback_per_shard import JitCallbackPerShard
from jaxmigrate.codemods.legacy_imports import LegacyImports
from jaxmigrate.codemods.partial_auto_callback import PartialAutoCallback
from jaxmigrate.codemods.pjit import Pjit
from jaxmigrate.codemods.pmap import Pmap
from jaxmigrate.codemods.with_mesh import WithMesh

from jaxmigrate.toolkit.passes import Pass

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
