"""Shared test settings of the xmatch-oan plugin (imported by each test module: a conftest.py
here would clash with other test folders' conftest modules when the suites run together)."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The models here are tiny: one thread is faster, and much faster on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
