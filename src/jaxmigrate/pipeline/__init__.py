"""The way a file goes: discovery, the prefilter, the engine (one source text through the
passes), notebooks, the file pipeline with its result cache, and the runner that writes.

It does the I/O the passes never do (see docs/architecture.md).
"""
