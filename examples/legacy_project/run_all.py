"""Run every module's main() once on a simulated 8-device CPU mesh (the verify-with command)."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import importlib  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

for name in ("train", "sharded", "blocks", "placement"):
    try:
        importlib.import_module(f"legacy_project.{name}").main()
        print(f"{name}: ok")
    except Exception as exc:  # the legacy code may no longer run on new JAX
        print(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
