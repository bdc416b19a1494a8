"""The half of the verifier that runs inside subprocesses, under the user's interpreter.

These modules are copied into each verification workspace as the top-level package
`_jaxmigrate_child` and put on the children's `PYTHONPATH`, so the user's interpreter needs
neither jaxmigrate nor its dependencies. They import each other relatively, never `jaxmigrate`.
Only `source`, `outside` and `protocol` (the messages both ends exchange) are imported by
the parent: everything else imports JAX or numpy.
"""
