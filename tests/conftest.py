"""Shared fixtures."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def one_thread():
    """One intra-op thread: tiny-model ops are too small to share, and CI's two cores are shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
