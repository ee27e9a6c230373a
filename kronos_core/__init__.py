"""Kronos model family: tokenizer, predictor, data, training and fast prediction.

Depends on torch, numpy, pandas, psutil, safetensors and tomli-w; never imports
kronos_tune or a UI library. The public
classes are imported lazily so `import kronos_core` (and the CLI) stays fast.
"""

from __future__ import annotations

from kronos_core.deferred import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "Kronos": "kronos_core.model",
    "KronosTokenizer": "kronos_core.tokenizer",
    "KronosPredictor": "kronos_core.predict.predictor",
    "KronosError": "kronos_core.errors",
    "build_model": "kronos_core.sizes",
    "build_tokenizer": "kronos_core.sizes",
}

__all__ = ["__version__", *_EXPORTS]
__getattr__ = lazy_exports(__name__, _EXPORTS)
