"""The bundles shipped in zoo/weights are written with today's argument names, and rewriting
their spec to those names changed neither a tensor byte nor a score bit.

The spec in each bundle's safetensors header was rewritten (``source`` / ``model`` ->
``backbone``); the digests below were taken before the rewrite, with the code of that time:
the data section after the header (every tensor), and the float32 score matrix of each model
on the test split of the ``tiny`` scenes preset (2 images x 10 captions, the default
EfficientNet-Lite0 features), computed on one torch thread.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

import xmatch
from xmatch.core.spec import COMPONENTS, INJECTED, check_component
from xmatch.demo.run import scenes_layout
from xmatch.eval.evaluate import encode_dataset, score_blocks
from xmatch.scenes.dataset import open_scenes
from xmatch.testing import one_torch_thread  # noqa: F401  (a fixture: scores are pinned on one thread)

pytest.importorskip("timm")

WEIGHTS = Path(__file__).resolve().parents[1] / "zoo" / "weights"

#: entry -> (sha256 of the tensor data section, sha256 of the scores on the tiny scenes test split)
PINNED = {
    "teran-mrsw-scenes": (
        "7afe9f9f0a34b23c6013e3ad11bd6e2d2f9b3854f951e6c58708d1966fab95a6",
        "39fd791df7feca0ed48e6d70105cbcb24049e901e5ceeda15723d796d5d59d12",
    ),
    "tern-scenes": (
        "316df4b0d3bb051fe4653e7c620c0be357f6d52321f99062ee9815667d9b5923",
        "9b55107bde70e742799b41398aaeea705e18b59e3d4d3d37b2734f77c495820a",
    ),
    "teran-mrsw-grid-scenes": (
        "8e866c300f48caaf0d1b9b39f08a8ad0299afc7bb8dbc307150f9e647d9446bb",
        "3aa6ff436fbc23d476b6e3afd5558ac8051d3a41d71c279f9a40b4bb2c06ce97",
    ),
}


def stored_spec(name: str) -> dict:
    with safe_open(str(WEIGHTS / name / "model.safetensors"), framework="pt") as f:
        return json.loads(f.metadata()["spec"])


@pytest.mark.parametrize("name", sorted(PINNED))
def test_the_stored_spec_uses_only_current_argument_names(name):
    spec = stored_spec(name)
    for key, kind in COMPONENTS.items():
        if isinstance(spec.get(key), dict):
            # canonical already: no unknown key, no default missing
            assert check_component(spec[key], kind, f"{name} -> {key}", INJECTED.get(key, ())) == spec[key]


@pytest.mark.parametrize("name", sorted(PINNED))
def test_the_tensors_are_the_bytes_shipped_before_the_rewrite(name):
    data = (WEIGHTS / name / "model.safetensors").read_bytes()
    (header_size,) = struct.unpack("<Q", data[:8])
    assert hashlib.sha256(data[8 + header_size :]).hexdigest() == PINNED[name][0]


@pytest.fixture(scope="module")
def scenes_root(tmp_path_factory, one_torch_thread) -> Path:  # noqa: F811
    return tmp_path_factory.mktemp("scenes")


@pytest.mark.parametrize("name", sorted(PINNED))
def test_the_scores_are_those_before_the_rewrite_to_the_last_bit(name, scenes_root):
    test = open_scenes(scenes_root, "test", size="tiny", layout=scenes_layout(name), progress=False)
    model = xmatch.build(name, pretrained=True).eval()
    images = len(test.captions) // test.captions_per_image
    (scores,) = score_blocks(
        model, encode_dataset(model, test, progress=False), [slice(0, images)], test.captions_per_image, progress=False
    )
    assert scores.shape == (2, 10) and scores.dtype == np.float32
    assert hashlib.sha256(scores.tobytes()).hexdigest() == PINNED[name][1], scores
