"""Relevance matrices for NDCG@25 (xmatch.eval.relevance, xmatch.eval.spice)."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from xmatch.eval import spice
from xmatch.eval.relevance import (
    check_captions,
    load_original_relevance,
    original_relevance_path,
    relevance_cache_path,
    relevance_matrix,
    rouge_score_relevance,
    rougel_relevance,
    rougel_score,
    save_original_relevance,
)
from xmatch.eval.spice import SpiceError, find_spice_jar, spice_relevance

from conftest import FIXTURES  # noqa: E402

pytestmark = pytest.mark.cpu_kernels  # floats from the CPU's kernels against stored ones (docs/testing.md)

EVAL_SMALL = FIXTURES / "teran-original" / "eval-small"
B2 = 1.2**2

SMALL = [
    "A dog runs on the grass.",
    "a dog runs on the grass",
    "the  dog is running ",
    "dog",
    "a brown dog",
    "Two cats sleep on a sofa",
    "a cat on a couch",
    "cats",
    "two cats sleeping",
    "a sofa with cats",
    "A red car on the road",
    "a car",
    "red car parked",
    "the road is empty",
    "a red vehicle on a street",
]


def f_beta(p: float, r: float) -> float:
    return (1 + B2) * p * r / (r + B2 * p)


@pytest.fixture(scope="module")
def eval_small() -> tuple[list[str], np.ndarray]:
    captions = [str(c) for c in np.load(EVAL_SMALL / "io.npz")["captions"]]
    original = np.fromfile(EVAL_SMALL / "coco" / "relevances" / "coco-test-rougeL.npy", np.float32)
    return captions, original.reshape(1250, 250)


# --- ROUGE-L, the original definition -------------------------------------------------------


def test_rougel_is_bit_equal_to_the_authors_file(eval_small):
    captions, original = eval_small
    computed = relevance_matrix(captions, "rougeL", progress=False)
    assert computed.dtype == np.float32 and computed.shape == (1250, 250)
    # bit-equal float32, not merely within an ulp
    np.testing.assert_array_equal(computed.view(np.int32), original.view(np.int32))


@pytest.mark.parametrize("block_size, workers", [(1, 1), (7, 2), (250, 1), (5000, 2)])
def test_rougel_is_the_same_for_every_block_size(eval_small, block_size, workers):
    captions, original = eval_small
    computed = rougel_relevance(captions[:500], block_size=block_size, workers=workers, progress=False)
    np.testing.assert_array_equal(computed, rougel_relevance(captions[:500], progress=False))
    # the queries' relevances against the first 100 images are a block of the full matrix
    np.testing.assert_array_equal(computed, original[:500, :100])


def test_rougel_score_matches_the_authors_file(eval_small):
    captions, original = eval_small
    rng = np.random.default_rng(0)
    for q, j in zip(rng.integers(0, 1250, 200), rng.integers(0, 250, 200)):
        assert np.float32(rougel_score(captions[q], captions[5 * j : 5 * j + 5])) == original[q, j]


def test_own_image_scores_one(eval_small):
    _, original = eval_small
    own = original[np.arange(1250), np.arange(1250) // 5]
    assert (own == 1.0).all()
    small = rougel_relevance(SMALL, progress=False)
    assert (small[np.arange(15), np.arange(15) // 5] == 1.0).all()


def test_rougel_hand_computed_cases():
    # punctuation stays attached: "grass." is not "grass"; case is folded
    assert rougel_score("a dog.", ["a dog"]) == f_beta(1 / 2, 1 / 2) == 0.5
    assert rougel_score("A DOG", ["a dog"]) == 1.0
    # a double space gives an empty token: ["a", "", "dog"] against ["a", "dog"]
    assert rougel_score("a  dog", ["a dog"]) == f_beta(2 / 3, 1.0)
    # a trailing space too, and two empty tokens match each other
    assert rougel_score("a dog ", ["a cat "]) == f_beta(2 / 3, 2 / 3)
    # P_max and R_max come from different references: 1.0 although no reference alone gives it
    assert rougel_score("a b c d", ["a b", "a b c d e f g h"]) == 1.0
    assert rougel_score("a b c d", ["a b"]) == f_beta(2 / 4, 1.0)
    assert rougel_score("a dog", ["two cats"]) == 0.0
    # LCS, not bag of words: order matters
    assert rougel_score("c b a", ["a b c"]) == f_beta(1 / 3, 1 / 3)


def test_rougel_matrix_matches_the_scalar_definition():
    matrix = relevance_matrix(SMALL, captions_per_image=5, progress=False)
    expected = [[rougel_score(q, SMALL[5 * j : 5 * j + 5]) for j in range(3)] for q in SMALL]
    np.testing.assert_array_equal(matrix, np.array(expected, dtype=np.float32))
    assert matrix[0, 0] == 1.0 and matrix[3, 1] == 0.0
    # "A dog runs on the grass." vs image 2: LCS 3 with "A red car on the road" (P = 3/6,
    # R = 3/6) and 1 with "a car" (P = 1/6, R = 1/2): P_max = R_max = 1/2
    assert matrix[0, 2] == np.float32(f_beta(3 / 6, 1 / 2)) == 0.5


def test_beta_changes_the_score():
    r = rougel_relevance(["a b c d", "x", "a b", "y"], 2, beta=1.0, progress=False)
    assert r[0, 1] == np.float32(2 * 0.5 * 1.0 / 1.5)


# --- rouge-score ----------------------------------------------------------------------------


def test_rouge_score_is_the_max_f_measure_over_references():
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"])
    matrix = rouge_score_relevance(SMALL, workers=1, progress=False)
    expected = [
        [max(scorer.score(r, q)["rougeL"].fmeasure for r in SMALL[5 * j : 5 * j + 5]) for j in range(3)] for q in SMALL
    ]
    np.testing.assert_array_equal(matrix, np.array(expected, dtype=np.float32))
    assert (matrix[np.arange(15), np.arange(15) // 5] == 1.0).all()
    # rouge-score drops punctuation, the original ROUGE-L does not
    pair = ["a dog.", "x", "a dog", "y"]
    assert rouge_score_relevance(pair, 2, progress=False, workers=1)[0, 1] == 1.0
    assert rougel_relevance(pair, 2, progress=False)[0, 1] == 0.5


def test_rouge_score_process_pool_gives_the_same_matrix():
    one = rouge_score_relevance(SMALL, workers=1, block_size=4, progress=False)
    two = relevance_matrix(SMALL, "rouge-score", workers=2, block_size=4, progress=False)
    np.testing.assert_array_equal(one, two)


@pytest.mark.parametrize("module, method", [("rouge_score", "rouge-score"), ("rapidfuzz", "rougel")])
def test_missing_optional_package_names_the_extra(monkeypatch, module, method):
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ImportError, match=r'pip install "xmatch-zoo\[eval\]"'):
        relevance_matrix(SMALL, method, progress=False)


# --- validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "captions, per_image, match",
    [
        ([], 5, "captions is empty"),
        (["a", "b", "c"], 2, "3 captions do not split into images of 2"),
        (["a", b"b"], 1, "caption 1 is bytes"),
        (["a", None], 2, "caption 1 is NoneType"),
        ("a dog", 1, "single string"),
        (["a"], 0, "positive integer"),
    ],
)
def test_invalid_captions_raise(captions, per_image, match):
    with pytest.raises(ValueError, match=match):
        relevance_matrix(captions, captions_per_image=per_image, progress=False)


def test_numpy_string_arrays_are_accepted():
    assert check_captions(np.array(["a", "b"]), 1) == ["a", "b"]


def test_unknown_method_and_option_raise():
    with pytest.raises(
        ValueError, match=r"unknown relevance method 'rouge'.*Available: \['rouge-score', 'rougel', 'spice'\]"
    ):
        relevance_matrix(SMALL, "rouge")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['stemmer'\] for method 'rouge-score'"):
        relevance_matrix(SMALL, "rouge_score", stemmer=True)
    with pytest.raises(ValueError, match="block_size must be positive"):
        rougel_relevance(SMALL, block_size=0)


# --- cache ----------------------------------------------------------------------------------


def test_cache_is_written_atomically_and_loaded(tmp_path):
    path = relevance_cache_path(SMALL, tmp_path, "rougeL")
    assert path.parent == tmp_path and path.name.startswith("rougel-15x3-") and path.suffix == ".npy"
    first = relevance_matrix(SMALL, cache_dir=tmp_path, progress=False)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left
    np.testing.assert_array_equal(np.load(path), first)
    # the second call reads the file: plant a marker to prove it
    np.save(path, np.full_like(first, 0.25))
    assert (relevance_matrix(SMALL, cache_dir=tmp_path, progress=False) == 0.25).all()


def test_cache_key_covers_captions_and_result_options(tmp_path):
    base = relevance_cache_path(SMALL, tmp_path)
    assert relevance_cache_path(SMALL, tmp_path, beta=1.2) == base  # defaults are filled in
    assert relevance_cache_path(SMALL, tmp_path, block_size=3) == base  # speed-only option
    assert relevance_cache_path(SMALL, tmp_path, beta=1.0) != base
    assert relevance_cache_path(SMALL[:-1] + ["other"], tmp_path) != base
    assert relevance_cache_path(SMALL, tmp_path, "rouge-score") != base
    assert relevance_cache_path(SMALL, tmp_path, captions_per_image=3).name.startswith("rougel-15x5-")


def test_unreadable_cache_is_recomputed(tmp_path):
    path = relevance_cache_path(SMALL, tmp_path)
    path.write_bytes(b"not an npy file")
    with pytest.warns(UserWarning, match="recomputing"):
        result = relevance_matrix(SMALL, cache_dir=tmp_path, progress=False)
    np.testing.assert_array_equal(np.load(path), result)


# --- the authors' files ---------------------------------------------------------------------


def test_original_relevance_path():
    assert original_relevance_path("data", "coco", "test", "ROUGEL") == Path(
        "data/coco/relevances/coco-test-rougeL.npy"
    )
    assert original_relevance_path("d", "f30k", "val", "spice").name == "f30k-val-spice.npy"
    with pytest.raises(ValueError, match="methods"):
        original_relevance_path("d", "coco", "test", "rouge-score")


def test_load_the_authors_fixture_files(eval_small):
    _, original = eval_small
    for kwargs in ({}, {"n_captions": 1250}, {"n_images": 250}, {"n_captions": 1250, "n_images": 250}):
        loaded = load_original_relevance(original_relevance_path(EVAL_SMALL, "coco", "test", "rougeL"), **kwargs)
        assert isinstance(loaded, np.memmap) and loaded.shape == (1250, 250) and not loaded.flags.writeable
        np.testing.assert_array_equal(loaded, original)
    spice_file = load_original_relevance(original_relevance_path(EVAL_SMALL, "coco", "test", "spice"))
    assert spice_file.shape == (1250, 250) and np.isfinite(spice_file).all()


def test_save_writes_the_raw_original_format(tmp_path):
    matrix = rougel_relevance(SMALL, progress=False)
    path = save_original_relevance(tmp_path / "coco" / "relevances" / "coco-test-rougeL.npy", matrix)
    assert path.stat().st_size == 15 * 3 * 4  # raw float32, no header
    np.testing.assert_array_equal(np.fromfile(path, np.float32).reshape(15, 3), matrix)
    np.testing.assert_array_equal(load_original_relevance(path, n_captions=15), matrix)
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_loader_errors(tmp_path):
    missing = tmp_path / "coco-test-rougeL.npy"
    with pytest.raises(FileNotFoundError, match=r"coco-test-rougeL\.npy.*raw float32"):
        load_original_relevance(missing)
    missing.write_bytes(b"\0" * 7)
    with pytest.raises(ValueError, match="7 bytes"):
        load_original_relevance(missing)
    save_original_relevance(missing, np.zeros((10, 3)))
    with pytest.raises(ValueError, match=r"30 float32 values.*7 x 4"):
        load_original_relevance(missing, n_captions=7)
    with pytest.raises(ValueError, match=r"10 x 4"):
        load_original_relevance(missing, n_captions=10, n_images=4)
    with pytest.raises(ValueError, match="not 5 n²"):
        load_original_relevance(missing)
    with pytest.raises(ValueError, match="must be \\(n_captions, n_images\\)"):
        save_original_relevance(missing, np.zeros(3))


# --- SPICE ----------------------------------------------------------------------------------


def fake_scores(captions: list[str], c: int) -> np.ndarray:
    """What tests/java/FakeSpice.java computes: token-overlap F1, NaN without test tokens."""
    out = np.empty((len(captions), len(captions) // c))
    for q, query in enumerate(captions):
        test = set(query.lower().split())
        for j in range(out.shape[1]):
            refs = set().union(*(r.lower().split() for r in captions[j * c : (j + 1) * c]))
            tp = len(test & refs)
            if not test or not refs:
                out[q, j] = math.nan
            else:
                p, r = tp / len(test), tp / len(refs)
                out[q, j] = 0.0 if tp == 0 else 2 * p * r / (p + r)
    return out


@pytest.fixture(scope="module")
def fake_jar(tmp_path_factory) -> Path:
    """tests/java/FakeSpice.java packaged as SPICE-1.0/spice-1.0.jar, with a lib/ folder."""
    if not (shutil.which("javac") and shutil.which("jar") and shutil.which("java")):
        pytest.skip("needs a JDK (javac, jar, java) on PATH")
    root = tmp_path_factory.mktemp("spice") / "SPICE-1.0"
    classes = root / "classes"
    classes.mkdir(parents=True)
    source = Path(__file__).parent / "java" / "FakeSpice.java"
    subprocess.run(["javac", "-d", str(classes), str(source)], check=True)
    jar = root / "spice-1.0.jar"
    subprocess.run(["jar", "cfe", str(jar), "FakeSpice", "-C", str(classes), "."], check=True)
    (root / "lib").mkdir()
    for name in spice.CORENLP_JARS:
        (root / "lib" / name).touch()
    return jar


@pytest.fixture
def java8(monkeypatch):
    """Pretend java is Java 8, so the fake jar runs without the Java-version warning."""
    monkeypatch.setattr(spice, "_java_major", lambda java: 8)


SPICE_CAPTIONS = ["a dog runs", "the dog sleeps", "a red car", "   ", "two cats", "cats on a sofa"]


def test_spice_fills_the_matrix_from_the_jar(fake_jar, java8, tmp_path):
    expected = fake_scores(SPICE_CAPTIONS, 2)
    assert np.isnan(expected[3]).all()  # the blank caption has no tuple
    # chunks of 4 pairs: 3 Java calls, outputs in reverse order, matched back by image_id
    matrix = spice_relevance(SPICE_CAPTIONS, 2, jar=fake_jar, chunk_pairs=4, nan_value=-1.0, workers=2, progress=False)
    assert matrix.dtype == np.float32 and matrix.shape == (6, 3)
    np.testing.assert_allclose(matrix, np.where(np.isnan(expected), -1.0, expected).astype(np.float32), rtol=0, atol=0)
    # "a dog runs" vs {a, dog, runs, the, sleeps}: P = 1, R = 3/5; "two cats" vs {a, red, car}: 0
    assert matrix[0, 0] == 0.75 and matrix[4, 1] == 0.0
    one_call = spice_relevance(SPICE_CAPTIONS, 2, jar=fake_jar, spice_cache=tmp_path / "parses", progress=False)
    np.testing.assert_array_equal(one_call, np.where(np.isnan(expected), 0.0, expected).astype(np.float32))


def test_spice_through_relevance_matrix_env_jar_and_cache(fake_jar, java8, monkeypatch, tmp_path):
    monkeypatch.setenv(spice.SPICE_JAR_ENV, str(fake_jar))
    first = relevance_matrix(SPICE_CAPTIONS, "spice", captions_per_image=2, cache_dir=tmp_path, progress=False)
    monkeypatch.setenv(spice.SPICE_JAR_ENV, str(tmp_path / "gone.jar"))  # the cache needs no jar
    np.testing.assert_array_equal(relevance_matrix(SPICE_CAPTIONS, "spice", 2, cache_dir=tmp_path), first)
    key = relevance_cache_path(SPICE_CAPTIONS, tmp_path, "spice", 2)
    assert relevance_cache_path(SPICE_CAPTIONS, tmp_path, "spice", 2, chunk_pairs=3, java="java8") == key
    assert relevance_cache_path(SPICE_CAPTIONS, tmp_path, "spice", 2, nan_value=0.5) != key


@pytest.mark.parametrize(
    "mode, match",
    [
        ("fail", r"(?s)exited with status 3.*fake failure.*Java 8"),
        ("garbage", r"malformed: not readable JSON"),
        ("missing", r"malformed: 1 of 18 pairs have no score \(first: \[0\]\)"),
    ],
)
def test_spice_failures(fake_jar, java8, monkeypatch, mode, match):
    monkeypatch.setenv("FAKE_SPICE_MODE", mode)
    with pytest.raises(SpiceError, match=match):
        spice_relevance(SPICE_CAPTIONS, 2, jar=fake_jar, progress=False)


def test_spice_wrong_image_ids_are_malformed(tmp_path):
    out = tmp_path / "output.json"
    out.write_text('[{"image_id": 9, "scores": {"All": {"f": 0.5}}}]')
    with pytest.raises(SpiceError, match=r"image_id 9, not one of the pairs sent \(0\.\.1\)"):
        spice._read_scores(out, range(2), "")
    out.write_text('{"image_id": 0}')
    with pytest.raises(SpiceError, match="expected a list"):
        spice._read_scores(out, range(1), "")
    out.write_text('[{"image_id": 0, "scores": {}}]')
    with pytest.raises(SpiceError, match=r"entry 0 has no image_id / scores\['All'\]\['f'\]"):
        spice._read_scores(out, range(1), "")


def test_spice_missing_jar_says_what_to_download(monkeypatch, tmp_path):
    monkeypatch.delenv(spice.SPICE_JAR_ENV, raising=False)
    with pytest.raises(FileNotFoundError, match=r"(?s)SPICE-1\.0\.zip.*get_stanford_models\.sh.*XMATCH_SPICE_JAR"):
        relevance_matrix(SPICE_CAPTIONS, "spice", 2, progress=False)
    monkeypatch.setenv(spice.SPICE_JAR_ENV, str(tmp_path / "spice-1.0.jar"))
    with pytest.raises(FileNotFoundError, match=r"spice-1\.0\.jar \(from \$XMATCH_SPICE_JAR\) does not exist"):
        find_spice_jar()
    (tmp_path / "spice-1.0.jar").touch()
    with pytest.raises(FileNotFoundError, match=r"lacks \['stanford-corenlp-3\.6\.0\.jar'.*get_stanford_models"):
        find_spice_jar()


def test_spice_missing_java(fake_jar):
    with pytest.raises(FileNotFoundError, match="Java executable 'no-such-java' not found"):
        spice_relevance(SPICE_CAPTIONS, 2, jar=fake_jar, java="no-such-java", progress=False)


def test_new_java_warns_that_spice_needs_java_8(fake_jar, monkeypatch):
    monkeypatch.setattr(spice, "_java_major", lambda java: 17)
    with pytest.warns(UserWarning, match="Java 17; SPICE 1.0 needs Java 8"):
        spice_relevance(SPICE_CAPTIONS[:2], 2, jar=fake_jar, progress=False)


def test_java_version_is_parsed():
    if shutil.which("java") is None:
        pytest.skip("no java on PATH")
    assert spice._java_major(shutil.which("java")) >= 8


def test_spice_with_java8_does_not_warn(fake_jar, java8):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spice_relevance(SPICE_CAPTIONS[:2], 2, jar=fake_jar, progress=False)
