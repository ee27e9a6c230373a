"""Published weights by their Hugging Face hub id (`NeoQuasar/Kronos-small`, `...@revision`) or a folder.

`resolve_pretrained(source)` turns what a user typed into the folder `from_pretrained` reads:

- a path that exists is a folder, used as it is (nothing else is consulted);
- otherwise `OWNER/NAME[@REVISION]` is a hub id: the local Hugging Face cache first (no network call when
  the revision's snapshot is there), a download of `config.json` + `model.safetensors` when online;
- anything else is a folder path too, and loading it gives the folder errors of `kronos_core.pretrained`.

The cache is the one `huggingface_hub` documents: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
`~/.cache/huggingface/hub`, holding `models--OWNER--NAME/refs/<branch or tag>` (a commit hash) and
`models--OWNER--NAME/snapshots/<commit>/<files>`. The environment is read at each call, so a process that
sets `HF_HUB_CACHE` or `HF_HUB_OFFLINE` after importing the library still gets what it asked for. Offline
(`HF_HUB_OFFLINE=1`, or `offline=True`: the CLI's `--offline`) nothing is downloaded.

`huggingface_hub` is an optional extra (`pip install "kronos-tune[hub]"`), imported only when a hub id is
resolved. Every failure is one `KronosError` line: not cached while offline (with the command that fetches
it), neither a folder nor a repo the hub knows, a snapshot without the files a checkpoint needs, the
package missing.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kronos_core.errors import KronosError, one_line
from kronos_core.optional import require

CONFIG_NAME = "config.json"     # a pretrained folder's two files (kronos_core.pretrained reads them)
WEIGHTS_NAME = "model.safetensors"
NEEDED_FILES = (CONFIG_NAME, WEIGHTS_NAME)
DEFAULT_REVISION = "main"
# OWNER/NAME as the hub spells repo ids (letters, digits, '-', '_', '.'; no leading '.' or '-', so './x' and
# '../x' stay paths), then an optional @REVISION (a branch, tag or commit hash).
_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9_][\w.-]{0,95})(?:@(?P<revision>[^\s@]+))?$")
_TRUE = {"1", "on", "yes", "true"}


@dataclass(frozen=True)
class HubId:
    repo_id: str
    revision: str | None  # None: the default branch

    def __str__(self) -> str:
        return self.repo_id if self.revision is None else f"{self.repo_id}@{self.revision}"


@dataclass(frozen=True)
class PretrainedSource:
    """Where a checkpoint was found: `path` is the folder to load; the rest is set for hub ids."""

    source: str                   # as given
    path: Path
    repo_id: str | None = None
    revision: str | None = None   # as asked (default branch: "main")
    commit: str | None = None     # the snapshot's commit hash
    downloaded: bool = False      # fetched by this call (else found in the cache)

    @property
    def from_hub(self) -> bool:
        return self.repo_id is not None

    def describe(self, label: str = "checkpoint") -> str:
        """One line for the terminal: what was asked, which commit it resolved to, and the folder."""
        if not self.from_hub:
            return f"{label} {self.path}"
        how = "downloaded into the Hugging Face cache" if self.downloaded else "from the Hugging Face cache"
        return (f"{label} {self.repo_id}@{self.revision}: commit {self.commit}, {how} ({self.path})")

    def to_dict(self) -> dict[str, Any]:
        """What run.json records."""
        record: dict[str, Any] = {"source": self.source, "path": str(self.path)}
        if self.from_hub:
            record.update(repo_id=self.repo_id, revision=self.revision, commit=self.commit,
                          downloaded=self.downloaded)
        return record


def parse_hub_id(text: str) -> HubId | None:
    """`OWNER/NAME[@REVISION]` as a HubId, else None (then it is a folder path)."""
    match = _HUB_ID.match(str(text))
    if match is None or ".." in match["repo"] or "--" in match["repo"]:
        return None
    return HubId(match["repo"], match["revision"])


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, from the environment as it is now (the library reads it once, at import)."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(os.path.expandvars(explicit)).expanduser()
    home = os.environ.get("HF_HOME")
    if not home:
        home = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def hub_offline(offline: bool | None = None) -> bool:
    """`offline` when given, else whether HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set to a true value."""
    if offline is not None:
        return offline
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().lower() in _TRUE


def fetch_command(hub_id: HubId) -> str:
    """The command that puts `hub_id` into the cache (run where there is network)."""
    revision = "" if hub_id.revision is None else f", revision='{hub_id.revision}'"
    return (f"python -c \"from huggingface_hub import snapshot_download; "
            f"snapshot_download('{hub_id.repo_id}'{revision})\"")


def resolve_pretrained(source: str | os.PathLike, offline: bool | None = None,
                       label: str = "checkpoint") -> PretrainedSource:
    """The folder to load for `source` (see the module doc); `label` names it in errors ("tokenizer"...)."""
    text = os.fspath(source)
    path = Path(text)
    hub_id = None if path.exists() else parse_hub_id(text)
    if hub_id is None:
        return PretrainedSource(text, path)
    return _resolve_hub(text, hub_id, hub_offline(offline), label)


def _resolve_hub(text: str, hub_id: HubId, offline: bool, label: str) -> PretrainedSource:
    require("hub", f"{label} {text}: no such folder, and loading it as a Hugging Face hub id",
            instead=f"pass a folder holding {CONFIG_NAME} and {WEIGHTS_NAME}")
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import (HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError,
                                       RevisionNotFoundError)

    cache = hub_cache_dir()
    revision = hub_id.revision or DEFAULT_REVISION
    where = f"{label} {text}"
    try:
        folder = Path(snapshot_download(hub_id.repo_id, revision=revision, cache_dir=cache, local_files_only=True))
    except LocalEntryNotFoundError:  # not in the cache, or a snapshot the library knows to be incomplete
        folder = None
    if folder is not None and not _missing(folder):
        return PretrainedSource(text, folder, hub_id.repo_id, revision, folder.name)
    if offline:
        if folder is not None:
            raise KronosError(f"{where}: the cached snapshot {folder} lacks {', '.join(_missing(folder))} and "
                              f"downloads are off (HF_HUB_OFFLINE=1 / --offline); fetch it where there is network: "
                              f"{fetch_command(hub_id)}")
        raise KronosError(f"{where}: no such folder, and the Hugging Face cache ({cache}) has no snapshot of "
                          f"{hub_id.repo_id} at revision {revision} while offline (HF_HUB_OFFLINE=1 / --offline); "
                          f"fetch it where there is network: {fetch_command(hub_id)}, or pass a folder")
    try:
        folder = Path(snapshot_download(hub_id.repo_id, revision=revision, cache_dir=cache,
                                        allow_patterns=list(NEEDED_FILES)))
    except RevisionNotFoundError:
        raise KronosError(f"{where}: the hub repo {hub_id.repo_id} has no revision '{revision}'; give a branch, "
                          f"tag or commit hash it has (or leave out @revision for main)") from None
    except RepositoryNotFoundError:
        raise KronosError(f"{where} is neither a folder nor a model repo on the Hugging Face hub (or it is private "
                          f"and no token was given); check the name, e.g. NeoQuasar/Kronos-small, or pass a "
                          f"folder holding {CONFIG_NAME} and {WEIGHTS_NAME}") from None
    except LocalEntryNotFoundError as error:  # the hub could not be reached and the cache has nothing
        reason = one_line(error.__cause__ or error, typed=False)[:200]
        raise KronosError(f"{where}: no such folder, not in the Hugging Face cache ({cache}), and the hub could "
                          f"not be reached ({reason}); fetch it where there is network: {fetch_command(hub_id)}, "
                          f"or pass a folder") from None
    except (HfHubHTTPError, OSError, ValueError) as error:
        raise KronosError(f"{where}: downloading from the Hugging Face hub failed ({one_line(error, typed=False)}"
                          f"); try again, or fetch it with: {fetch_command(hub_id)}") from None
    missing = _missing(folder)
    if missing:
        raise KronosError(f"{where}: the snapshot {folder} has no {', '.join(missing)}; a Kronos checkpoint "
                          f"needs {CONFIG_NAME} and {WEIGHTS_NAME} (pickled .bin/.pt files are never loaded)")
    return PretrainedSource(text, folder, hub_id.repo_id, revision, folder.name, downloaded=True)


def _missing(folder: Path) -> list[str]:
    return [name for name in NEEDED_FILES if not (folder / name).is_file()]


def resolve_sources(sources: dict[str, str | os.PathLike | None],
                    offline: bool | None = None) -> dict[str, PretrainedSource]:
    """Each named source resolved (the ones given as None are left out), e.g. {"checkpoint": ..., "tokenizer": ...}."""
    return {label: resolve_pretrained(value, offline, label) for label, value in sources.items() if value}
