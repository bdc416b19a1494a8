"""What passes are built from: the `Pass` base class and its per-file state, the scope model,
the code emitter, import editing, positions, mesh analysis and the `ast` facts of a module.

Nothing here knows a particular rule, reads files or imports JAX (see docs/architecture.md).
"""
