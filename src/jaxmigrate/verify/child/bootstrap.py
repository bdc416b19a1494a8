"""The recorder's bootstrap, copied into the workspace as `sitecustomize.py`.

Python runs it at start-up in every process of the recorded command (the directory is first on
`PYTHONPATH`); it installs the recording import hook, then runs the `sitecustomize` it shadows.
"""

import importlib.machinery
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
if os.environ.get("JAXMIGRATE_RECORD"):
    try:
        from _jaxmigrate_child import recorder as _recorder

        _recorder.install(os.environ["JAXMIGRATE_RECORD"])
    except Exception as _exc:  # noqa: BLE001 - recording must never break the user's command
        sys.stderr.write(f"jaxmigrate: the recorder was not installed: {_exc}\n")
if os.environ.get("JAXMIGRATE_COORDINATOR"):
    try:
        from _jaxmigrate_child import distributed as _distributed

        _distributed.install()
    except Exception as _exc:  # noqa: BLE001 - reported; the command then runs on its own
        sys.stderr.write(f"jaxmigrate: could not join the multi-process job: {_exc}\n")
_path = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _path)
if _spec is not None and _spec.loader is not None and _spec.origin != __file__:
    _code = _spec.loader.get_code("sitecustomize")  # type: ignore[attr-defined]
    if _code is not None:
        exec(_code, {"__name__": "sitecustomize", "__file__": _spec.origin})  # noqa: S102
