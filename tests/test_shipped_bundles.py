"""The bundles shipped in zoo/weights are written with today's argument names, and rewriting
their spec to those names changed no tensor byte and no score.

The spec in each bundle's safetensors header was rewritten (``source`` / ``model`` ->
``backbone``); the digests of the data section after the header (every tensor) were taken
before the rewrite: those bytes do not depend on the machine, so they are compared exactly.

The scores are another matter: the float32 score matrix of each model on the test split of the
``tiny`` scenes preset (2 images x 10 captions, the default EfficientNet-Lite0 features, one
torch thread) depends on the vector width of the kernels that compute the features and the
model (AVX-512, AVX2 or scalar), in its last bits. So the scores are compared with a tolerance
that covers the kernel sets, and their order is compared exactly.
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

pytestmark = pytest.mark.cpu_kernels  # floats from the CPU's kernels against stored ones (docs/testing.md)

pytest.importorskip("timm")

WEIGHTS = Path(__file__).resolve().parents[1] / "zoo" / "weights"

#: entry -> sha256 of its tensor data section, taken before the rewrite
TENSOR_DIGESTS = {
    "teran-mrsw-scenes": "7afe9f9f0a34b23c6013e3ad11bd6e2d2f9b3854f951e6c58708d1966fab95a6",
    "tern-scenes": "316df4b0d3bb051fe4653e7c620c0be357f6d52321f99062ee9815667d9b5923",
    "teran-mrsw-grid-scenes": "8e866c300f48caaf0d1b9b39f08a8ad0299afc7bb8dbc307150f9e647d9446bb",
}


def stored_spec(name: str) -> dict:
    with safe_open(str(WEIGHTS / name / "model.safetensors"), framework="pt") as f:
        return json.loads(f.metadata()["spec"])


@pytest.mark.parametrize("name", sorted(TENSOR_DIGESTS))
def test_the_stored_spec_uses_only_current_argument_names(name):
    spec = stored_spec(name)
    for key, kind in COMPONENTS.items():
        if isinstance(spec.get(key), dict):
            # canonical already: no unknown key, no default missing
            assert check_component(spec[key], kind, f"{name} -> {key}", INJECTED.get(key, ())) == spec[key]


@pytest.mark.parametrize("name", sorted(TENSOR_DIGESTS))
def test_the_tensors_are_the_bytes_shipped_before_the_rewrite(name):
    data = (WEIGHTS / name / "model.safetensors").read_bytes()
    (header_size,) = struct.unpack("<Q", data[:8])
    assert hashlib.sha256(data[8 + header_size :]).hexdigest() == TENSOR_DIGESTS[name]


@pytest.fixture(scope="module")
def scenes_root(tmp_path_factory, one_torch_thread) -> Path:  # noqa: F811
    return tmp_path_factory.mktemp("scenes")


#: the scores on an AVX2 machine (torch's CPU capability AVX2, AMD EPYC, one thread), after the rewrite.
#: Before it, on an AVX-512 machine, the digests of the score matrices were pinned; on the AVX2 machine
#: teran-mrsw-scenes and teran-mrsw-grid-scenes give those very bits (sha256 39fd791d..., 3aa6ff43...),
#: tern-scenes does not (9e5d84d0... against 9b55107b...)
SCORES = {
    "teran-mrsw-grid-scenes": [
        [1.5870308876037598, 1.4007132053375244, 1.035294771194458, 1.0906133651733398, 1.3610410690307617, 0.8905600309371948, 1.394851803779602, 1.3457973003387451, 1.029114007949829, 1.4252649545669556],
        [1.7459359169006348, 1.5070363283157349, 1.1341403722763062, 1.1972103118896484, 1.4682598114013672, 0.9490270018577576, 1.525809407234192, 1.442582130432129, 1.1881426572799683, 1.54436457157135],
    ],
    "teran-mrsw-scenes": [
        [1.8057541847229004, 1.5972609519958496, 1.394906997680664, 1.4142762422561646, 1.6933696269989014, 1.227698802947998, 1.3273676633834839, 1.3930543661117554, 1.088979959487915, 1.3471581935882568],
        [1.815409541130066, 1.5712112188339233, 1.4560741186141968, 1.3980298042297363, 1.6940585374832153, 1.4536969661712646, 1.5300160646438599, 1.6897777318954468, 1.4738280773162842, 1.7375645637512207],
    ],
    "tern-scenes": [
        [0.8372609615325928, 0.7381237745285034, 0.8230122327804565, 0.7891671657562256, 0.8722108602523804, 0.8001294732093811, 0.8528701663017273, 0.798151433467865, 0.8288310170173645, 0.7759488821029663],
        [0.8501167297363281, 0.7579056620597839, 0.8452897667884827, 0.8150516748428345, 0.8864555358886719, 0.8257361650466919, 0.8647176027297974, 0.8167216181755066, 0.8431869149208069, 0.7925384640693665],
    ],
}

#: the scores of one machine differ from another's by the kernels' rounding: under torch's scalar
#: kernels (ATEN_CPU_CAPABILITY=default) against AVX2 on one machine, by 1.2e-5 at most (TERAN's
#: MrSw sums a word's best region over up to 12 words, on scores up to 1.8); the tolerance is 8x
#: that, and 17x smaller than the closest two scores of a row or a column, so the order is pinned too
SCORE_TOLERANCE = 1e-4


@pytest.mark.parametrize("name", sorted(TENSOR_DIGESTS))
def test_the_stored_scores_are_far_enough_apart_to_pin_the_order(name):
    expected = np.asarray(SCORES[name], dtype=np.float32)
    for axis in (0, 1):
        assert np.diff(np.sort(expected, axis=axis), axis=axis).min() > 2 * SCORE_TOLERANCE


@pytest.mark.parametrize("name", sorted(TENSOR_DIGESTS))
def test_the_scores_are_those_before_the_rewrite(name, scenes_root):
    test = open_scenes(scenes_root, "test", size="tiny", layout=scenes_layout(name), progress=False)
    model = xmatch.build(name, pretrained=True).eval()
    images = len(test.captions) // test.captions_per_image
    (scores,) = score_blocks(
        model, encode_dataset(model, test, progress=False), [slice(0, images)], test.captions_per_image, progress=False
    )
    expected = np.asarray(SCORES[name], dtype=np.float32)
    assert scores.shape == (2, 10) and scores.dtype == np.float32
    np.testing.assert_allclose(scores, expected, rtol=0, atol=SCORE_TOLERANCE)
    for axis in (0, 1):  # captions ranked for each image, images for each caption
        assert (scores.argsort(axis=axis) == expected.argsort(axis=axis)).all(), scores
