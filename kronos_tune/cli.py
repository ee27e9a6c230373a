"""The `kronos-tune` command line: thin commands that parse, call the library, render.

Each command lives in its own module under `kronos_tune/commands/` and adds
itself to `app` through a `register(app)` function; this file only wires them
and turns user-fixable errors into one line on stderr with exit code 2.
"""

from __future__ import annotations

import importlib
import sys

import typer

from kronos_core import __version__
from kronos_core.errors import KronosError

app = typer.Typer(
    name="kronos-tune",
    help="Profile, tune and run the Kronos financial foundation model on your hardware.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Modules under kronos_tune.commands, each with register(app).
COMMAND_MODULES: tuple[str, ...] = (
    "presets",
    "monitor",
    "predict",
    "train",
    "profile",
    "dashboard",
    "autobatch",
    "benchmark",
    "backtest",
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"kronos-tune {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Profile, tune and run the Kronos financial foundation model on your hardware."""


for _name in COMMAND_MODULES:
    importlib.import_module(f"kronos_tune.commands.{_name}").register(app)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: user-fixable errors become one line and exit code 2."""
    try:
        app(args=argv, standalone_mode=True)
    except KronosError as error:
        typer.echo(f"error: {error}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
