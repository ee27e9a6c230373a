"""Writing files so that a reader never sees half of one, and TOML in and out.

Every file the project writes goes through `atomic_path` (for libraries that
write by file name: torch.save, safetensors, matplotlib, pyarrow) or
`atomic_writer` (for our own text and bytes). Both write a temp file with a
unique name in the target's folder (same file system, so the rename is
atomic), fsync it, rename it over the target and fsync the folder, so the
rename itself survives a power cut. A failure midway removes the temp file and
leaves the old target untouched.
"""

from __future__ import annotations

import os
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterator

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

import tomli_w

from kronos_core.errors import KronosError


def _fsync_folder(folder: Path) -> None:
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:  # some file systems (and Windows) cannot open a folder
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def _new_temp(path: Path) -> Path:
    """A new empty file beside `path` under a random name. Created with mode 0o666 less the umask, as
    open() would (mkstemp's 0600 would make every file the project writes private to its owner)."""
    for _ in range(100):
        temp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp{path.suffix}")
        try:
            os.close(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return temp
    raise FileExistsError(f"no free temp name beside {path}")


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a fresh temp path beside `path`; on a clean exit it becomes `path`, on an error it is removed.

    The temp name ends in the target's suffix, so writers that pick the format by suffix (matplotlib's
    savefig) or append one when it is missing (numpy.save) write the intended file."""
    path = Path(path)
    temp = _new_temp(path)
    try:
        yield temp
        with open(temp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)


@contextmanager
def atomic_writer(path: str | Path, mode: str = "w", encoding: str | None = "utf-8",
                  newline: str | None = None) -> Iterator[IO[Any]]:
    """An open handle (`mode` "w" or "wb") whose content replaces `path` only when the block ends cleanly."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_writer mode must be 'w' or 'wb', not {mode!r}")
    with atomic_path(path) as temp:
        if mode == "wb":
            with open(temp, "wb") as handle:
                yield handle
        else:
            with open(temp, "w", encoding=encoding, newline=newline) as handle:
                yield handle


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_writer(path) as handle:
        handle.write(text)


def _without_none(value: Any) -> Any:
    """TOML has no null: None entries are left out (a reader falls back to the field's default)."""
    if isinstance(value, dict):
        return {key: _without_none(item) for key, item in value.items() if item is not None}
    if isinstance(value, (list, tuple)):
        return [_without_none(item) for item in value if item is not None]
    return value


def dumps_toml(values: dict[str, Any], header: str = "") -> str:
    """A TOML document (tomli-w), with `header` as leading comment lines and None values left out."""
    comments = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    try:
        body = tomli_w.dumps(_without_none(values))
    except TypeError as error:
        raise KronosError(f"cannot write as TOML: {error}; only strings, numbers, booleans, lists and tables") from None
    return comments + body


def write_toml(path: str | Path, values: dict[str, Any], header: str = "") -> None:
    write_text_atomic(path, dumps_toml(values, header))


def load_toml(path: str | Path, what: str = "config file", fix: str = "check the path") -> dict[str, Any]:
    """Parse a TOML file; a missing file (`what` names it, `fix` says what to do), a syntax error or an
    unreadable file becomes one KronosError line starting with the path."""
    path = Path(path)
    if not path.is_file():
        raise KronosError(f"{path}: {what} not found; {fix}")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise KronosError(f"{path}: malformed TOML ({error}); fix the syntax there") from None
    except (OSError, UnicodeDecodeError) as error:
        raise KronosError(f"{path}: cannot read the {what} ({error}); check that it is a readable UTF-8 "
                          f"text file") from None
