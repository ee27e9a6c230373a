"""`kronos-tune config keys`: every TrainConfig key (the keys of a `train --config` file) with type and default;
`kronos-tune config convert FILE.yaml`: an upstream finetune_csv config as the equivalent TOML."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Group
from rich.padding import Padding
from rich.text import Text

from kronos_tune.commands.common import make_console
from kronos_tune.errors import KronosTuneError

# What each key does, in a line. A key missing here is still listed (with its type and default).
DESCRIPTIONS: dict[str, str] = {
    "what": "which model to train: the predictor, or the tokenizer",
    "model_size": "Kronos size (published: mini with context 2048; small and base with context 512)",
    "tokenizer_dir": "folder of a published or trained tokenizer (config.json + model.safetensors), or a hub id "
                     "(NeoQuasar/Kronos-Tokenizer-base[@revision]); left out: a random-init tokenizer",
    "predictor_dir": "folder or hub id of a published predictor to finetune (e.g. NeoQuasar/Kronos-small); "
                     "left out: random init",
    "data": "CSV/Parquet files or folders of K-lines, or [\"synthetic\"]",
    "symbol_column": "data files are panels (one long table of many symbols); this column names each series",
    "date_format": "strptime directives of the data files' text dates (e.g. \"%d/%m/%Y %H:%M\"); left out: dates "
                   "written day and month first are read the one way they allow, refused when both fit",
    "train_until": "train on bars up to this date (2010-05-14 or 20100514: that whole day; 2010-05-14 15:00: "
                   "up to that bar), or this fraction of the data's timeline (0.75); year first, day/month "
                   "forms are refused; recorded in data_span.json for the backtest's leakage check",
    "synthetic_series": "synthetic data: number of series",
    "synthetic_rows": "synthetic data: rows per series",
    "val_fraction": "share of each series kept for validation (its last rows)",
    "lookback_window": "history rows per training window",
    "predict_window": "future rows per training window",
    "clip": "normalized values are clipped to [-clip, clip]",
    "batch_size": "windows per micro-batch on each process",
    "accumulation_steps": "micro-batches per optimizer step (effective batch = batch_size x this x processes)",
    "amp": "autocast precision for the forward pass",
    "activation_checkpointing": "recompute activations in backward: none, every block, or every n-th",
    "activation_checkpointing_every_n": "with activation_checkpointing = \"every_n\": recompute every n-th block",
    "compile": "torch.compile mode (off skips compilation)",
    "matmul_precision": "torch.set_float32_matmul_precision (high allows TF32 on Ampere+)",
    "optimizer_impl": "AdamW implementation (auto picks fused on CUDA)",
    "lr": "peak learning rate; left out: 4e-5 (predictor) or 2e-4 (tokenizer), as the reference",
    "betas": "AdamW betas",
    "weight_decay": "AdamW weight decay",
    "schedule": "learning-rate schedule: onecycle (reference) or plateau",
    "pct_start": "onecycle: share of the steps spent warming up",
    "div_factor": "onecycle: initial lr = lr / div_factor",
    "plateau_factor": "plateau: lr multiplier after a plateau",
    "plateau_patience": "plateau: evaluations without improvement before lowering the lr",
    "grad_clip": "gradient-norm clip; left out: 3.0 (predictor) or 2.0 (tokenizer)",
    "num_workers": "DataLoader worker processes (0: load in the training process)",
    "pin_memory": "pin host batches for faster copies to the GPU",
    "preload": "keep the windows' data in RAM, or memory-map it",
    "teacher_forcing": "predictor: condition s2 on the true s1 tokens (reference behaviour)",
    "seed": "seed for weights, windows and sampling",
    "samples_per_epoch": "windows drawn per epoch (an epoch is samples_per_epoch / effective batch steps)",
    "epochs": "epochs in the schedule",
    "eval_samples": "validation windows per evaluation",
    "eval_every": "evaluate every N optimizer steps (0: at the end of each epoch)",
    "save_every": "save the training state (checkpoints/last.pt) every N optimizer steps (0: at the end of each "
                  "epoch)",
    "output_dir": "where the run writes; `kronos-tune train` gives each run its own folder unless --out is given",
    "device": "auto, cpu or cuda",
    "parallelism": "with several processes: ddp (replicated weights) or fsdp (sharded)",
    "fsdp_reshard_after_forward": "fsdp: free gathered weights after forward (less memory, more traffic)",
    "fsdp_cpu_offload": "fsdp: keep parameters and optimizer state in host memory",
    "fsdp_sync_micro_batches": "fsdp: reduce gradients after every micro-batch instead of the last one",
}

CHOICE_CONSTANTS = {"what": "WHAT", "amp": "AMP", "activation_checkpointing": "CHECKPOINTING", "compile": "COMPILE",
                    "optimizer_impl": "OPTIMIZER_IMPL", "schedule": "SCHEDULES", "preload": "PRELOAD",
                    "device": "DEVICES", "matmul_precision": "MATMUL_PRECISION", "parallelism": "PARALLELISM"}


@dataclasses.dataclass
class KeyInfo:
    """One TrainConfig key as a config file writes it."""

    name: str
    type: str
    default: Any
    choices: list[str] | None
    description: str


def _toml_value(value: Any) -> str:
    if value is None:
        return "(left out)"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def config_keys() -> list[KeyInfo]:
    """Every TrainConfig field, in declaration order, with the choices the config validates against."""
    from kronos_core.sizes import SIZES
    from kronos_core.train import TrainConfig
    from kronos_core.train import config as config_module

    keys = []
    for spec in dataclasses.fields(TrainConfig):
        default = spec.default_factory() if spec.default_factory is not dataclasses.MISSING else spec.default
        if isinstance(default, tuple):
            default = list(default)
        constant = CHOICE_CONSTANTS.get(spec.name)
        choices = list(SIZES) if spec.name == "model_size" else (
            list(getattr(config_module, constant)) if constant and hasattr(config_module, constant) else None)
        kind = str(spec.type).replace("tuple[float, float]", "list of 2 floats").replace(" | None", " (optional)")
        keys.append(KeyInfo(spec.name, kind, default, choices, DESCRIPTIONS.get(spec.name, "")))
    return keys


def keys_listing(keys: list[KeyInfo]) -> Group:
    """Each key as `name = default  type`, its description indented below: readable at 80 columns, where
    a four-column table squeezed the descriptions to a dozen characters."""
    parts: list[Any] = [Text("TrainConfig keys: a `kronos-tune train --config FILE` TOML file holds flat "
                             "key = value lines\n", style="bold")]
    for key in keys:
        parts.append(Text.assemble((key.name, "bold"), " = ", _toml_value(key.default), ("  " + key.type, "dim")))
        choices = f"; one of: {', '.join(key.choices)}" if key.choices else ""
        text = (key.description or "(no description)") + choices
        parts.append(Padding(Text(text), (0, 0, 0, 4), expand=False))
    return Group(*parts)


config_app = typer.Typer(help="Training configuration files: the keys they take, and converting upstream YAML.", no_args_is_help=True)


@config_app.command("keys")
def keys(as_json: Annotated[bool, typer.Option("--json", help="Print the keys as JSON.")] = False) -> None:
    """List every TrainConfig key with its type, default and what it does."""
    found = config_keys()
    if as_json:
        typer.echo(json.dumps([dataclasses.asdict(key) for key in found], indent=2))
        return
    make_console().print(keys_listing(found))


@config_app.command("convert")
def convert(
    source: Annotated[Path, typer.Argument(help="An upstream Kronos finetune_csv YAML (or a kronos-tune TOML).", dir_okay=False)],
    out: Annotated[Optional[Path], typer.Option("--out", help="The TOML to write [default: SOURCE with .toml].", dir_okay=False)] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace the file --out names.")] = False,
) -> None:
    """Write a training file as the equivalent kronos-tune TOML, each key under a comment naming where it came
    from (the data is read to count the windows of upstream's epoch)."""
    from kronos_core.files import write_text_atomic
    from kronos_core.train.train_file import load_train_file
    from kronos_tune.train.convert import default_target, train_file_toml

    target = out or default_target(source)
    if target.resolve() == source.resolve():
        raise KronosTuneError(f"config convert: --out {target} is the file being converted; name another file")
    if target.exists() and not overwrite:
        raise KronosTuneError(f"config convert: {target} exists; give --out ANOTHER.toml or add --overwrite")
    job = load_train_file(source)
    write_text_atomic(target, train_file_toml(job))
    console = make_console()
    for note in job.notes:
        console.print(f"[cyan]note:[/] {note}", highlight=False, soft_wrap=True)
    console.print(f"wrote {target} ({' then '.join(job.phases) or job.what}); train it with: kronos-tune train "
                  f"--config {target}", highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.add_typer(config_app, name="config")
