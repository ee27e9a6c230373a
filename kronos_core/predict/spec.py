"""One description of a predictor and one builder, used by every caller that predicts.

`PredictorSpec` names the weights (a model size with random weights, or checkpoint and tokenizer folders)
and every option of `KronosPredictor`; it is plain data, so a parent process can hand it to ranks or
actors as JSON. `build_predictor(spec)` is the only place a `KronosPredictor` is constructed outside the
tests: a new option is one field here and one keyword below.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from kronos_core.errors import KronosError


@dataclass(frozen=True)
class PredictorSpec:
    size: str | None = None           # random weights of this size (when no checkpoint)
    checkpoint: str | None = None     # a pretrained folder (config.json + model.safetensors)
    tokenizer: str | None = None      # its tokenizer's folder (None: random weights of `size`)
    seed: int = 0                     # of the random weights
    device: str = "cpu"               # "cpu", "cuda", "cuda:N" (a rank or actor may put it on another device)
    amp: str | None = None            # None, "bf16" or "fp16"
    weight_dtype: str | None = None   # None (as loaded, float32) or "bf16": the weights held in bf16
    max_context: int = 512
    window_mode: str = "refill"
    use_cache: bool = True
    max_batch_size: int | None = None  # sequences per predict call (None: call_size.rows_per_call)
    cuda_graphs: bool | None = None    # None: on when the device is CUDA

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> PredictorSpec:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})

    def on(self, device: Any) -> PredictorSpec:
        """The same predictor on another device (a rank's cuda:LOCAL_RANK, or the CPU): CUDA graphs only on
        CUDA."""
        device = str(device)
        graphs = self.cuda_graphs if device.startswith("cuda") else False
        return replace(self, device=device, cuda_graphs=graphs)


Weights = tuple[Any, Any]  # (Kronos, KronosTokenizer)


def load_weights(spec: PredictorSpec) -> Weights:
    """The model and tokenizer the spec names, on the CPU (errors name the folder and the key)."""
    from kronos_core.model import Kronos
    from kronos_core.sizes import build_model, build_tokenizer
    from kronos_core.tokenizer import KronosTokenizer

    if spec.checkpoint is None and spec.size is None:
        raise KronosError("a predictor needs a model size (random weights) or a checkpoint folder")
    model = Kronos.from_pretrained(spec.checkpoint) if spec.checkpoint is not None \
        else build_model(spec.size, seed=spec.seed)
    tokenizer = KronosTokenizer.from_pretrained(spec.tokenizer) if spec.tokenizer is not None \
        else build_tokenizer(spec.size, seed=spec.seed)
    return model, tokenizer


def build_predictor(spec: PredictorSpec, weights: Weights | None = None):
    """The predictor the spec describes; `weights`: a (model, tokenizer) pair already loaded (several
    settings over one model share them)."""
    from kronos_core.predict.predictor import KronosPredictor

    model, tokenizer = weights if weights is not None else load_weights(spec)
    return KronosPredictor(model, tokenizer, device=spec.device, max_context=spec.max_context, amp=spec.amp,
                           window_mode=spec.window_mode, use_cache=spec.use_cache,
                           max_batch_size=spec.max_batch_size, cuda_graphs=spec.cuda_graphs,
                           weight_dtype=spec.weight_dtype)


__all__ = ["PredictorSpec", "build_predictor", "load_weights"]
