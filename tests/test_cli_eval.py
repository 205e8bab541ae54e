"""`xmatch eval` end to end: an original TERAN checkpoint, converted, evaluated on its inputs
written in the TERAN data layout, reproduces the original evaluation's figures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from xmatch.cli.main import main
from xmatch.eval.relevance import save_original_relevance

from conftest import NDCG_RTOL

pytestmark = pytest.mark.cpu_kernels  # floats from the CPU's kernels against stored ones (docs/testing.md)


@pytest.fixture(scope="module")
def teran_layout(mrsw_io, tmp_path_factory) -> Path:
    """The fixture's 4 images and 20 captions as a Flickr-style TERAN data folder."""
    root = tmp_path_factory.mktemp("f30k")
    (root / "annotations").mkdir()
    images, sizes = [], {}
    for n in range(4):
        r = int(mrsw_io["n_regions"][n])
        (root / "features_36" / "bu_att").mkdir(parents=True, exist_ok=True)
        (root / "features_36" / "bu_box").mkdir(parents=True, exist_ok=True)
        np.savez_compressed(root / "features_36" / "bu_att" / str(n), feat=mrsw_io["region_features"][n, :r])
        np.save(root / "features_36" / "bu_box" / str(n), mrsw_io["boxes_pixel_xyxy"][n, :r])
        sentences = [{"raw": str(c), "imgid": n, "sentid": 5 * n + k} for k, c in enumerate(mrsw_io["captions"][5 * n : 5 * n + 5])]
        images.append({"imgid": n, "split": "test", "filename": f"{n}.jpg", "sentids": list(range(5 * n, 5 * n + 5)),
                       "sentences": sentences})
        sizes[str(n)] = [int(v) for v in mrsw_io["image_sizes_wh"][n]]
    (root / "annotations" / "dataset_flickr30k.json").write_text(json.dumps({"images": images, "dataset": "flickr30k"}))
    (root / "sizes.json").write_text(json.dumps(sizes))
    save_original_relevance(root / "f30k" / "relevances" / "f30k-test-rougeL.npy", mrsw_io["rel_rougeL"])
    save_original_relevance(root / "f30k" / "relevances" / "f30k-test-spice.npy", mrsw_io["rel_spice"])
    return root


def test_eval_command_reproduces_the_original_i2t_figures(mrsw_small, mrsw_io, teran_layout, tmp_path, capsys):
    assert main(["convert", str(mrsw_small / "checkpoint.pth"), str(tmp_path / "bundle")]) == 0
    rel = teran_layout / "f30k" / "relevances"
    code = main([
        "eval", f"local-dir:{tmp_path / 'bundle'}", "--data", str(teran_layout), "--dataset", "teran",
        "--data-option", f"sizes={teran_layout / 'sizes.json'}",
        "--relevance", f"rougeL={rel / 'f30k-test-rougeL.npy'}", "--relevance", f"spice={rel / 'f30k-test-spice.npy'}",
        "--json", str(tmp_path / "r.json"), "--queries", str(tmp_path / "q.json"), "--batch-size", "3",
    ])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "rsum" in out and "ndcg_spice" in out
    figures = json.loads((tmp_path / "r.json").read_text())
    got = [figures["i2t"][k] for k in ("r1", "r5", "r10", "medr", "meanr", "ndcg_rougel", "ndcg_spice")]
    np.testing.assert_array_equal(got[:5], mrsw_io["i2t_metrics"][:5])
    np.testing.assert_allclose(got[5:], mrsw_io["i2t_metrics"][5:], rtol=NDCG_RTOL)
    queries = json.loads((tmp_path / "q.json").read_text())["queries"]
    np.testing.assert_array_equal(queries["i2t_ranks"], mrsw_io["i2t_ranks"])
    np.testing.assert_array_equal(np.array(queries["i2t_top"])[:, 0], mrsw_io["i2t_top1"])


def test_eval_command_computes_and_caches_rouge_l(mrsw_small, mrsw_io, teran_layout, tmp_path, capsys):
    spec = f"teran-mrsw-f30k={mrsw_small / 'checkpoint.pth'}"  # an original checkpoint, converted on the fly
    args = ["eval", spec, "--data", str(teran_layout), "--data-option", f"sizes={teran_layout / 'sizes.json'}",
            "--relevance", "rougel", "--relevance-cache", str(tmp_path / "cache"), "--json", str(tmp_path / "r.json")]
    assert main(args) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "r.json").read_text())["i2t"]["ndcg_rougel"] == pytest.approx(mrsw_io["i2t_metrics"][5], rel=NDCG_RTOL)
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 1


def test_eval_command_errors_are_one_line(teran_layout, tmp_path, capsys):
    assert main(["eval", "teran-mrsw-coco", "--data", str(tmp_path / "nowhere"), "--dataset", "teran"]) == 2
    assert capsys.readouterr().err == f"xmatch eval: teran dataset root: folder {tmp_path / 'nowhere'} does not exist.\n"
    assert main(["eval", "teran-mrsw-coco", "--data", str(tmp_path / "nowhere")]) == 2  # no layout to recognise
    assert capsys.readouterr().err == f"xmatch eval: the data folder {tmp_path / 'nowhere'} does not exist.\n"
    assert main(["eval", "teran-mrsw-coco", "--data", str(teran_layout), "--dataset", "tern"]) == 2
    assert "Did you mean: 'teran'?" in capsys.readouterr().err
    assert main(["eval", "teran-mrsw-coco", "--data", str(teran_layout), "--data-option", f"sizes={teran_layout / 'sizes.json'}"]) == 2
    assert "has no published xmatch weights" in capsys.readouterr().err
    assert main(["eval", f"teran-mrsw-coco={tmp_path / 'w.bin'}", "--data", str(teran_layout),
                 "--data-option", f"sizes={teran_layout / 'sizes.json'}"]) == 2
    assert "expected a .safetensors file or an original .pth checkpoint" in capsys.readouterr().err
