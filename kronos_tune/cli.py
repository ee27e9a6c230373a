"""The `kronos-tune` command line: thin commands that parse, call the library, render.

Each command lives in its own module under `kronos_tune/commands/` and adds
itself to the app through a `register(app)` function; this file only wires them
(only the one being run, so a command starts without the others' imports) and
turns user-fixable errors into one line on stderr with exit code 2.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from pathlib import PurePath
from typing import Any, get_args

import typer

try:  # typer >= 0.2x carries its own copy of click
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover - older typer on click
    from click import exceptions as click_errors

from kronos_core import __version__
from kronos_core.errors import KronosError, KronosWarning

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
    "config",
    "report",
    "plan",
    "backtest",
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"kronos-tune {__version__}")
        raise typer.Exit()


def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Profile, tune and run the Kronos financial foundation model on your hardware."""


def build_app(commands: tuple[str, ...] = COMMAND_MODULES) -> typer.Typer:
    """The command line with these commands (each module registers the command of its name)."""
    built = typer.Typer(
        name="kronos-tune",
        help="Profile, tune and run the Kronos financial foundation model on your hardware.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    built.callback()(_root)
    for name in commands:
        importlib.import_module(f"kronos_tune.commands.{name}").register(built)
    return built


def __getattr__(name: str) -> Any:
    # `app` (every command) is built on first use: `main` builds only the command it runs, so a command's
    # start-up does not import every other command's libraries.
    if name == "app":
        built = globals()["app"] = build_app()
        return built
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def metavar(param: Any) -> str:
    """A short upper-case name for what an option takes: INT, FLOAT, TEXT, FILE, DIR, PATH or the choices.

    Typer's own labels (`<int range>`, `<list[Path]>`, `<bool>` for a flag) are Python types, not what to type."""
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return ""
    described = getattr(param, "type_descriptor", None)  # typer >= 0.2x: annotations, not click types
    if described is None:
        name = getattr(param.type, "name", "text")
        return "|".join(map(str, param.type.choices)) if hasattr(param.type, "choices") else \
            {"integer": "INT", "integer range": "INT", "float": "FLOAT", "float range": "FLOAT"}.get(
                name, "PATH" if name in ("path", "directory", "file") else "TEXT")
    if described.choices is not None:
        return "|".join(str(getattr(choice, "value", choice)) for choice in described.choices)
    annotation = described.annotation
    if described.is_list:
        annotation = get_args(annotation)[0]
    if described.is_path or (isinstance(annotation, type) and issubclass(annotation, PurePath)):
        return str(described.path_type).upper()
    return {int: "INT", float: "FLOAT"}.get(annotation, "TEXT")


def readable_metavars(command: Any) -> Any:
    """Give every option of `command` and its subcommands a readable metavar (unless one was set)."""
    for param in command.params:
        if getattr(param, "param_type_name", "") == "option" and param.metavar is None:
            param.metavar = metavar(param)
    help_option = command.get_help_option

    def quiet_help_option(ctx: Any) -> Any:  # --help is a flag: no value to name
        option = help_option(ctx)
        if option is not None and option.metavar is None:
            option.metavar = ""
        return option

    command.get_help_option = quiet_help_option
    for sub in getattr(command, "commands", {}).values():
        readable_metavars(sub)
    return command


def usage_error_line(error: Any) -> str:
    """A click usage error (unknown option, missing or bad value) as one line that says where to look."""
    message = " ".join(error.format_message().split()).rstrip(".")
    ctx = getattr(error, "ctx", None)
    if ctx is None:
        return f"error: {message}"
    return f"error: {ctx.command_path}: {message}; see `{ctx.command_path} --help`"


def _show_warning(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
                  line: str | None = None) -> None:
    """KronosWarning (something to change that still works) as one `warning:` line; others as Python shows them."""
    if issubclass(category, KronosWarning):
        typer.echo(f"warning: {message}", err=True)
    else:
        _python_show_warning(message, category, filename, lineno, file, line)


_python_show_warning = warnings.showwarning


def main(argv: list[str] | None = None) -> None:
    """Console entry point: usage errors and user-fixable errors become one line on stderr and exit code 2."""
    warnings.showwarning = _show_warning
    args = sys.argv[1:] if argv is None else argv
    from kronos_tune.runs import remember_command_line

    remember_command_line(["kronos-tune", *args])
    try:
        _run(argv, args)
    finally:  # a Python caller's next run (tests, notebooks) is not this command line's
        remember_command_line([])


def _run(argv: list[str] | None, args: list[str]) -> None:
    chosen = (args[0],) if args and args[0] in COMMAND_MODULES else COMMAND_MODULES
    command = readable_metavars(typer.main.get_command(build_app(chosen)))
    try:
        code = command.main(args=argv, prog_name="kronos-tune", standalone_mode=False)
    except KronosError as error:
        typer.echo(f"error: {error}", err=True)
        sys.exit(2)
    except click_errors.ClickException as error:
        if type(error).__name__ != "NoArgsIsHelpError":  # that one printed the help already
            typer.echo(usage_error_line(error), err=True)
        sys.exit(error.exit_code)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
