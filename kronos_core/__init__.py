"""Kronos model family: tokenizer, predictor, data, training and fast prediction.

Depends on torch, numpy and pandas only; never imports kronos_tune.
"""

__version__ = "0.1.0"
