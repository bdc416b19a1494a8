"""Shared test set-up: the fixture corpus, the `--update-fixtures` option, JAX subprocess env."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-fixtures",
        action="store_true",
        help="rewrite every <case>.expected.py from the current passes (review the diff!)",
    )


def jax_env(devices: int = 8) -> dict[str, str]:
    """Environment for a subprocess that runs JAX on a simulated CPU mesh."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_PLATFORMS"] = "cpu"
    env.setdefault("PYTHONHASHSEED", "0")
    return env


@pytest.fixture
def python() -> str:
    return sys.executable
