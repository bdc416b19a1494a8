"""The `jaxmigrate` command: one module per verb, wired into one typer app here."""

from __future__ import annotations

import sys

import typer

from jaxmigrate.cli import check, explain, rules, run, verify

app = typer.Typer(
    name="jaxmigrate",
    help=(
        "Move JAX code off pmap, pjit, experimental shard_map and legacy mesh contexts, "
        "and prove each semantic rewrite by running it."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.command("run")(run.run)
app.command("check")(check.check)
app.command("rules")(rules.rules)
app.command("explain")(explain.explain)
app.command("verify")(verify.verify)


def main() -> None:
    """Entry point of the console script; internal errors exit 2 with one line, no traceback."""
    try:
        app()
    except KeyboardInterrupt:
        sys.stderr.write("jaxmigrate: interrupted; files already written are complete\n")
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: never a traceback
        sys.stderr.write(f"jaxmigrate: internal error: {type(exc).__name__}: {exc}\n")
        sys.exit(2)
