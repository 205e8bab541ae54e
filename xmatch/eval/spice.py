"""SPICE relevance through the Java SPICE 1.0 scorer.

SPICE (Anderson et al., "SPICE: Semantic Propositional Image Caption Evaluation", ECCV 2016)
parses captions into scene graphs and scores a test caption by the F-score of its semantic
tuples against those of the reference captions. TERAN's second NDCG relevance
(`evaluate_utils/compute_relevance.py`, method ``spice``) is, for caption query q and image j,
the SPICE ``scores["All"]["f"]`` of test = q against refs = the captions of image j.

The jar is not shipped: download https://panderson.me/images/SPICE-1.0.zip, unzip it, run
``SPICE-1.0/get_stanford_models.sh`` (it puts Stanford CoreNLP 3.6.0 in ``SPICE-1.0/lib/``)
and pass ``jar=`` or set ``XMATCH_SPICE_JAR`` to ``SPICE-1.0/spice-1.0.jar``. SPICE 1.0 needs
Java 8: from Java 15 the JavaScript engine it pretty-prints ``-out`` with is gone, and from
Java 16 its CoreNLP/LMDB start-up is refused by the module system.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from xmatch.core.errors import XmatchError
from xmatch.eval.captions import check_captions
from xmatch.core.progress import progress_bar

SPICE_JAR_ENV = "XMATCH_SPICE_JAR"
SPICE_JAVA_ENV = "XMATCH_SPICE_JAVA"
SPICE_DOWNLOAD = "https://panderson.me/images/SPICE-1.0.zip"
CORENLP_JARS = ("stanford-corenlp-3.6.0.jar", "stanford-corenlp-3.6.0-models.jar")
_TAIL = 2000


class SpiceError(XmatchError, RuntimeError):
    """The SPICE scorer failed or wrote output that cannot be read."""


def find_spice_jar(jar: str | os.PathLike | None = None) -> Path:
    """Locate ``spice-1.0.jar`` (argument, else ``$XMATCH_SPICE_JAR``) and check its CoreNLP jars.

    Raises:
        FileNotFoundError: no jar given, the jar is missing, or ``lib/`` next to it lacks the
            Stanford CoreNLP 3.6.0 jars; the message says what to download and where to put it.

    Example:
        >>> find_spice_jar("/opt/SPICE-1.0/spice-1.0.jar")  # needs the SPICE jar  # doctest: +SKIP
        PosixPath('/opt/SPICE-1.0/spice-1.0.jar')
    """
    setup = (
        f"Download {SPICE_DOWNLOAD}, unzip it, run SPICE-1.0/get_stanford_models.sh (it downloads "
        "Stanford CoreNLP 3.6.0 into SPICE-1.0/lib/), then pass jar='/path/to/SPICE-1.0/spice-1.0.jar' "
        f"or set {SPICE_JAR_ENV} to that path."
    )
    source = "the jar argument" if jar is not None else f"${SPICE_JAR_ENV}"
    jar = jar if jar is not None else os.environ.get(SPICE_JAR_ENV)
    if not jar:
        raise FileNotFoundError(f"SPICE relevance needs the SPICE 1.0 jar, and none was given. {setup}")
    path = Path(jar).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"the SPICE jar {path} (from {source}) does not exist. {setup}")
    missing = [name for name in CORENLP_JARS if not (path.parent / "lib" / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{path.parent / 'lib'} lacks {missing}, which spice-1.0.jar loads; run "
            f"{path.parent / 'get_stanford_models.sh'} (from {SPICE_DOWNLOAD})."
        )
    return path


def _java_major(java: str) -> int | None:
    done = subprocess.run([java, "-version"], check=False, capture_output=True, text=True, errors="replace")
    found = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
    if not found:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def _spice_f(value: Any) -> float:
    # the original's float_convert: null (NaN pretty-printed by JSON.stringify) and junk -> NaN
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _tail(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _TAIL else "..." + text[-_TAIL:]


def _read_scores(out_path: Path, ids: range, log: str) -> np.ndarray:
    def malformed(problem: str) -> SpiceError:
        return SpiceError(f"SPICE output {out_path} is malformed: {problem}.\nSPICE log (tail):\n{log}")

    try:
        results = json.loads(out_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise malformed(f"not readable JSON ({e})") from e
    if not isinstance(results, list):
        raise malformed(f"expected a list of {{'image_id', 'scores'}} objects, got {type(results).__name__}")
    scores = np.full(len(ids), np.nan)
    seen = np.zeros(len(ids), dtype=bool)
    for k, item in enumerate(results):
        try:
            pair, f = item["image_id"], item["scores"]["All"]["f"]
        except (KeyError, TypeError) as e:
            raise malformed(f"entry {k} has no image_id / scores['All']['f'] ({e!r})") from e
        if not isinstance(pair, int) or pair not in ids:
            raise malformed(f"entry {k} has image_id {pair!r}, not one of the pairs sent ({ids.start}..{ids.stop - 1})")
        scores[pair - ids.start] = _spice_f(f)
        seen[pair - ids.start] = True
    if not seen.all():
        missing = [ids.start + int(i) for i in np.flatnonzero(~seen)[:5]]
        raise malformed(f"{int((~seen).sum())} of {len(ids)} pairs have no score (first: {missing})")
    return scores


def _run_chunk(
    captions: list[str], c: int, ids: range, launcher: list[str], options: list[str], cwd: Path, workdir: Path
) -> np.ndarray:
    n_images = len(captions) // c
    items = []
    for pair in ids:
        q, j = divmod(pair, n_images)
        items.append({"image_id": pair, "test": captions[q], "refs": captions[j * c : (j + 1) * c]})
    in_path, out_path = workdir / "input.json", workdir / "output.json"
    in_path.write_text(json.dumps(items), encoding="utf-8")
    out_path.unlink(missing_ok=True)
    # SPICE wants the input file right after the jar, then its options
    full = [*launcher, str(in_path), "-out", str(out_path), *options]
    done = subprocess.run(full, check=False, cwd=cwd, capture_output=True, text=True, errors="replace")
    log = _tail(done.stderr or done.stdout)
    if done.returncode != 0:
        raise SpiceError(
            f"SPICE exited with status {done.returncode}: {' '.join(full)}\nstderr (tail):\n{log}\n"
            "SPICE 1.0 needs Java 8 (pass java= or set "
            f"{SPICE_JAVA_ENV}) and Stanford CoreNLP 3.6.0 in its lib/ folder; -Xmx must fit in memory."
        )
    return _read_scores(out_path, ids, log)


def spice_relevance(
    captions: Sequence[str],
    captions_per_image: int = 5,
    *,
    jar: str | os.PathLike | None = None,
    java: str | None = None,
    memory: str = "8G",
    chunk_pairs: int = 50_000,
    spice_cache: str | os.PathLike | None = None,
    nan_value: float = 0.0,
    workers: int | None = None,
    progress: bool = True,
) -> np.ndarray:
    """SPICE relevance matrix, ``(n_captions, n_images)`` float32, through the Java SPICE 1.0 jar.

    ``rel[q, j]`` is SPICE's ``scores["All"]["f"]`` for test = caption q and refs = the captions
    of image j, as in the original. Every (query, image) pair is one SPICE item; the pairs go to
    ``java -Xmx<memory> -jar spice-1.0.jar input.json -out output.json -subset -silent`` in
    chunks of ``chunk_pairs`` (one JVM start-up per chunk, not per query as the original).
    Cost: SPICE parses every caption of every item, so ``n_captions x n_images x (1 + c)``
    parses without ``spice_cache`` (COCO 5K: 125M pairs, far beyond a day); with
    ``spice_cache`` SPICE stores parses in an LMDB folder and reuses them across chunks and runs.

    Differences from the original: the original passed captions through the PTB tokenizer
    (lowercased, punctuation tokens removed) before SPICE and kept NaN scores (a caption without
    tuples); here captions go to SPICE as given and NaN becomes ``nan_value``.

    Args:
        captions: all captions, image by image.
        captions_per_image: captions of each image.
        jar: path of ``spice-1.0.jar`` (default: ``$XMATCH_SPICE_JAR``).
        java: the Java executable (default: ``$XMATCH_SPICE_JAVA`` or ``java`` on PATH); use a
            Java 8 runtime.
        memory: the JVM heap (``-Xmx``).
        chunk_pairs: (query, image) pairs per SPICE call.
        spice_cache: SPICE's ``-cache`` folder for caption parses.
        nan_value: relevance stored where SPICE reports NaN.
        workers: SPICE ``-threads`` (default: SPICE's own, all processors).
        progress: show a tqdm bar over the pairs.

    Raises:
        FileNotFoundError: no jar, CoreNLP jars or java executable.
        SpiceError: SPICE exited with an error (the message holds its stderr tail) or its
            output lacks pairs or is malformed.

    Example:
        >>> rel = spice_relevance(captions, jar="SPICE-1.0/spice-1.0.jar")  # needs the SPICE jar and Java  # doctest: +SKIP
    """
    captions = check_captions(captions, captions_per_image)
    if chunk_pairs < 1:
        raise ValueError(f"chunk_pairs must be positive, got {chunk_pairs}.")
    jar_path = find_spice_jar(jar)
    java = java or os.environ.get(SPICE_JAVA_ENV) or "java"
    java_path = shutil.which(java)
    if java_path is None:
        raise FileNotFoundError(
            f"Java executable '{java}' not found; install a Java 8 runtime and put it on PATH, or "
            f"pass java='/path/to/java' (or set {SPICE_JAVA_ENV})."
        )
    major = _java_major(java_path)
    if major is not None and major >= 15:
        warnings.warn(
            f"{java_path} is Java {major}; SPICE 1.0 needs Java 8 (it writes -out through the "
            f"JavaScript engine removed in Java 15). Pass java= or set {SPICE_JAVA_ENV}.",
            stacklevel=2,
        )
    launcher = [java_path, f"-Xmx{memory}", "-jar", str(jar_path)]
    options = ["-subset", "-silent"]
    if spice_cache is not None:
        Path(spice_cache).mkdir(parents=True, exist_ok=True)
        options += ["-cache", str(Path(spice_cache).resolve())]
    if workers is not None:
        options += ["-threads", str(workers)]
    n_images = len(captions) // captions_per_image
    total = len(captions) * n_images
    scores = np.empty(total, dtype=np.float64)
    with (
        tempfile.TemporaryDirectory(prefix="xmatch-spice-") as workdir,
        progress_bar(total=total, desc="SPICE", unit="pair", show=progress) as bar,
    ):
        for start in range(0, total, chunk_pairs):
            ids = range(start, min(start + chunk_pairs, total))
            scores[start : ids.stop] = _run_chunk(
                captions, captions_per_image, ids, launcher, options, jar_path.parent, Path(workdir)
            )
            bar.update(len(ids))
    scores[np.isnan(scores)] = nan_value
    return scores.reshape(len(captions), n_images).astype(np.float32)
