"""A model's text side on new captions: build it from a training split, and check that
captions fit it.

A word-level text encoder (``bigru``, ``bilstm``, a ``bert`` trained from scratch, the
plugins' ``scan-bigru``, ``vsepp-gru``, ``oan-textcnn``) only knows the words of the
captions its vocabulary was built from; every other word becomes one unknown token, and a
caption made of unknown tokens looks like every other. :func:`build_text_side` builds the
vocabulary (or BERT word-level tokenizer) from training captions; :func:`check_captions`
measures the unknown-token rate of captions under a model's text side and warns, or refuses,
before training or evaluation goes on with captions the model cannot read.

Example:
    >>> from xmatch.data import open_dataset
    >>> train = open_dataset("teran", "data/mine", split="train", captions="data/mine/dataset.json")  # needs the user's dataset  # doctest: +SKIP
    >>> side = build_text_side("teran-mrsw-scenes", train.captions, "runs/mine/text_side")  # doctest: +SKIP
    >>> model = xmatch.build("teran-mrsw-scenes", **side.spec_overrides)  # doctest: +SKIP
    >>> check_captions(model, train.captions, "training").rate  # doctest: +SKIP
    0.0
"""

from __future__ import annotations

import filecmp
import logging
import os
import shutil
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from xmatch.io.bundle import read_bundle_spec
from xmatch.core.zoo import info
from xmatch.components.text.words import Vocabulary, build_vocabulary
from xmatch.components.text.side import MANIFEST, TextSide, TokenCoverage
from xmatch.core.errors import XmatchError
from xmatch.core.registry import text_encoders
from xmatch.core.spec import check_component, instantiate, load_spec, merge, signature_of

logger = logging.getLogger(__name__)

#: unknown-token rate above which :func:`check_captions` warns
WARN_RATE = 0.05
#: unknown-token rate above which :func:`check_captions` refuses (unless allowed)
ERROR_RATE = 0.20
#: the text side's folder inside a run folder (``xmatch train --build-text-side``)
TEXT_SIDE_DIR = "text_side"
#: captions measured at most by :func:`check_captions` (an evenly spaced sample beyond)
MAX_MEASURED = 100_000

TRAIN_FIX = (
    "Build the text side from the training captions (xmatch train ... --build-text-side, or "
    "xmatch.data.vocab.build_text_side; `xmatch vocab MODEL --data ...` shows the figures), or use a "
    "model whose vocabulary comes from captions like these."
)
EVAL_FIX = (
    "The model's vocabulary comes from other captions: evaluate a model trained on captions like "
    "these (xmatch train ... --build-text-side builds its text side from them)."
)


class UnknownWordsWarning(UserWarning):
    """Captions with many tokens the model's text side does not know."""


class UnknownWordsError(XmatchError, ValueError):
    """Too many caption tokens are unknown to the model's text side to go on."""


def text_encoder_table(model: str | os.PathLike | Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``text_encoder`` table of a model source, overrides applied, defaults filled in.

    Args:
        model: a zoo name, a spec dict, a spec ``.toml`` file or ``local-dir:DIR``.
        overrides: nested spec overrides, as for :func:`xmatch.build`.

    Example:
        >>> text_encoder_table("teran-mrsw-scenes")["name"]
        'bigru'
    """
    if isinstance(model, Mapping):
        spec = load_spec(model)
    else:
        text = os.fspath(model)
        if text.startswith("local-dir:"):
            spec, _ = read_bundle_spec(text[len("local-dir:") :])
        elif text.startswith("hf-hub:"):
            raise ValueError(f"'{text}': read the text side of a Hub bundle with xmatch.build('{text}', pretrained=False).text_encoder.")
        elif text.endswith(".toml"):
            spec = load_spec(text)
        else:
            spec = info(text).spec
    spec = merge(spec, overrides or {})
    if "text_encoder" not in spec:
        raise ValueError(f"the spec of '{model}' has no [text_encoder] table.")
    return check_component(spec["text_encoder"], "text_encoders", "model -> text_encoder")


def build_text_encoder(table: Mapping[str, Any]) -> Any:
    """The text encoder of a ``text_encoder`` table, without pretrained weights (enough to
    tokenise: :func:`token_coverage` needs nothing more)."""
    table = dict(table)
    if "pretrained" in table:
        table["pretrained"] = False
    return instantiate(table, "text_encoders")


def build_text_side(
    model: str | os.PathLike | Mapping[str, Any],
    captions: Sequence[str],
    directory: str | os.PathLike,
    *,
    min_count: int | None = None,
    max_length: int | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> TextSide:
    """Build the text side of ``model``'s text encoder from ``captions`` into ``directory``.

    A text encoder whose builder takes ``vocab`` gets a word vocabulary (``vocab.json``); one
    with a ``build_text_side`` classmethod builds its own (``bert``: a word-level tokenizer and
    config, for a BERT trained from scratch). The folder also gets ``text_side.json``, the
    record of what was built (:meth:`TextSide.load` reads it).

    Args:
        model: a zoo name, spec dict, spec ``.toml`` or ``local-dir:DIR`` (its architecture).
        captions: the training captions.
        directory: the text-side folder (created; files in it are replaced).
        min_count: keep words seen at least this often; default: the encoder's ``min_count``
            (1 for ``bigru``/``bilstm``/``bert``, 4 for the SCAN / VSE++ / OAN plugins).
        max_length: the longest caption in tokens: BERT's position embeddings (default: the
            longest caption, measured), a word-level encoder's truncation (default: its own).
        overrides: nested spec overrides of ``model``.

    Raises:
        ValueError: the text encoder has no word-level text side (e.g. a pretrained BERT), or
            no word is frequent enough.

    Example:
        >>> side = build_text_side("teran-mrsw-scenes", ["a red cat", "a cat"], "runs/mine/text_side")
        >>> side.summary()
        'word vocabulary of 3 words from 2 captions, longest 3 tokens: runs/mine/text_side/vocab.json'
        >>> model = xmatch.build("teran-mrsw-scenes", **side.spec_overrides)
    """
    captions = list(captions)
    if not captions:
        raise ValueError("no captions to build the text side from.")
    table = text_encoder_table(model, overrides)
    name = table["name"]
    builder = text_encoders.get(name)
    count = min_count if min_count is not None else int(table.get("min_count", 1))
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    hook = getattr(builder, "build_text_side", None)
    if hook is not None:
        side = hook(captions, directory, table, count, max_length)
    elif "vocab" in signature_of(builder).parameters:
        side = build_vocabulary(captions, directory, count)
        if max_length is not None and "max_length" in signature_of(builder).parameters:
            side.arguments["max_length"] = max_length
    else:
        raise ValueError(
            f"text encoder '{name}' has no word-level text side to build from captions (its builder takes no "
            "'vocab' and has no build_text_side); its tokenizer comes with it."
        )
    side.save()
    return side


def run_text_side(
    model: str | os.PathLike | Mapping[str, Any],
    captions: Sequence[str],
    run_dir: str | os.PathLike,
    *,
    min_count: int | None = None,
    max_length: int | None = None,
    overrides: Mapping[str, Any] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    context: Any | None = None,
) -> TextSide:
    """The text side of a training run, in ``run_dir/text_side`` (``xmatch train --build-text-side``).

    A new run claims the run folder first (refused when it holds another run, unless
    ``overwrite``, which also removes the old text side), then builds the text side from
    ``captions``; a resumed run keeps the one it started with. An existing text side built from
    other captions or settings is never replaced silently. Under ``torchrun`` (``context``
    from :func:`xmatch.train.distributed.setup`) the main process builds it and the others
    wait, then read it.

    Raises:
        RunFolderError: a new run in a folder that holds another run.
        ValueError: ``model`` has trained weights (``local-dir:``, ``hf-hub:``), or no
            word-level text side.

    Example:
        >>> side = run_text_side("teran-mrsw-scenes", ["a red circle", "a blue seven"], "runs/mine")
        >>> model = xmatch.build("teran-mrsw-scenes", **side.spec_overrides)
    """
    # only a training run needs the trainer's modules; measuring and building do not
    from xmatch.io.run_folder import RunFolderError
    from xmatch.io.run_folder import claim_for_new_run

    if not isinstance(model, Mapping) and os.fspath(model).startswith(("local-dir:", "hf-hub:")):
        raise ValueError(
            f"--build-text-side builds a new vocabulary, which the trained weights of '{model}' do not fit; "
            "train an architecture from scratch with it (a zoo name or a spec file), or fine-tune the bundle "
            "with its own text side."
        )
    run_dir = Path(run_dir)
    directory = run_dir / TEXT_SIDE_DIR
    if context is None or context.is_main:
        if resume and (directory / MANIFEST).is_file():
            logger.info("resuming: using the run's text side in %s", directory)
        else:
            # a folder holding only a text side is a new run that stopped before its first
            # step (e.g. refused by a data check): the same text side is used again
            only_text_side = run_dir.is_dir() and {p.name for p in run_dir.iterdir()} <= {directory.name, f".{directory.name}.partial"}
            if not resume and not only_text_side:
                refusal = claim_for_new_run(run_dir, overwrite=overwrite)
                if refusal is not None:
                    raise RunFolderError(refusal)
            if overwrite:
                shutil.rmtree(directory, ignore_errors=True)
            _build_once(model, captions, directory, min_count, max_length, overrides)
    if context is not None:
        context.barrier()
    return TextSide.load(directory)


def _build_once(
    model: Any, captions: Sequence[str], directory: Path, min_count: int | None, max_length: int | None,
    overrides: Mapping[str, Any] | None,
) -> None:
    """Build into a temporary folder and move it in place; an existing text side must be the same."""
    tmp = directory.with_name(f".{directory.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    build_text_side(model, captions, tmp, min_count=min_count, max_length=max_length, overrides=overrides)
    if not directory.exists():
        os.replace(tmp, directory)
        return
    same = _same_files(tmp, directory)
    shutil.rmtree(tmp, ignore_errors=True)
    if not same:
        raise ValueError(
            f"{directory} holds the text side of an earlier run, built from other captions or settings; "
            "continue that run with --resume, start this one in a new run folder (--out), or replace the old "
            "run with --overwrite."
        )


def _same_files(a: Path, b: Path) -> bool:
    cmp = filecmp.dircmp(a, b)
    if cmp.left_only or cmp.right_only or cmp.funny_files:
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)
    return not mismatch and not errors and all(_same_files(a / d, b / d) for d in cmp.common_dirs)


def token_coverage(model_or_encoder: Any, captions: Sequence[str]) -> TokenCoverage | None:
    """How many caption tokens the text encoder maps to its unknown token.

    Asks the encoder's ``token_coverage(texts)`` (``bigru``, ``bilstm``, ``scan-bigru``:
    words; ``bert``: [UNK] word pieces), else its ``vocabulary`` (an xmatch
    :class:`~xmatch.components.text.rnn.Vocabulary`, as ``vsepp-gru`` and ``oan-textcnn``
    have). None when the encoder has no notion of an unknown token.

    Example:
        >>> token_coverage(xmatch.build("teran-mrsw-scenes"), ["a red circle", "a zebra"]).unknown
        1
    """
    encoder = getattr(model_or_encoder, "text_encoder", model_or_encoder)
    texts = list(captions)
    method = getattr(encoder, "token_coverage", None)
    if callable(method):
        return method(texts)
    vocabulary = getattr(encoder, "vocabulary", None)
    if isinstance(vocabulary, Vocabulary):
        return vocabulary.coverage(texts)
    return None


def check_captions(
    model_or_encoder: Any,
    captions: Sequence[str],
    role: str,
    *,
    allow: bool = False,
    warn_above: float = WARN_RATE,
    error_above: float = ERROR_RATE,
    fix: str = TRAIN_FIX,
    allow_hint: str = "--allow-unknown-words (recipe: allow_unknown_words = true)",
) -> TokenCoverage | None:
    """Measure the unknown-token rate of ``captions`` under the model's text side; warn above
    ``warn_above``, refuse above ``error_above`` unless ``allow``; warn about captions that
    have no known token at all.

    Args:
        model_or_encoder: a model (its ``text_encoder`` is used) or a text encoder.
        captions: the captions (at most :data:`MAX_MEASURED`, evenly spaced, are measured).
        role: what the captions are, for the messages (``"training"``, ``"test split"``).
        allow: warn instead of refusing above ``error_above``.
        fix: what to do about it, appended to the messages.
        allow_hint: how to go on anyway, appended to the error.

    Returns:
        The coverage, or None when the encoder has no unknown token.

    Raises:
        UnknownWordsError: the rate is above ``error_above`` and not ``allow``.

    Example:
        >>> check_captions(xmatch.build("teran-mrsw-scenes"), ["a zebra grazing", "two zebras"], "training")
        Traceback (most recent call last):
        xmatch.data.vocab.UnknownWordsError: the training captions do not fit the text encoder 'bigru': ...
    """
    texts = list(captions)
    if len(texts) > MAX_MEASURED:
        step = len(texts) / MAX_MEASURED
        texts = [texts[int(k * step)] for k in range(MAX_MEASURED)]
    coverage = token_coverage(model_or_encoder, texts)
    name = _encoder_name(model_or_encoder)
    if coverage is None:
        logger.info("text encoder '%s' has no unknown token: the %s captions are not measured.", name, role)
        return None
    sample = f" (measured on {len(texts):,} of {len(captions):,})" if len(texts) < len(captions) else ""
    if coverage.all_unknown:
        warnings.warn(
            f"{coverage.all_unknown:,} of the {coverage.captions:,} {role} captions{sample} have no token the "
            f"text encoder '{name}' knows: to the model they are all the same caption. {fix}",
            UnknownWordsWarning,
            stacklevel=2,
        )
    message = (
        f"the {role} captions do not fit the text encoder '{name}'{sample}: {coverage.summary()}. The model "
        f"cannot tell unknown words apart. {fix}"
    )
    if coverage.rate > error_above and not allow:
        raise UnknownWordsError(f"{message} To go on anyway: {allow_hint}.")
    if coverage.rate > warn_above:
        warnings.warn(message, UnknownWordsWarning, stacklevel=2)
    return coverage


def _encoder_name(model_or_encoder: Any) -> str:
    spec = getattr(model_or_encoder, "spec", None)
    if isinstance(spec, Mapping) and isinstance(spec.get("text_encoder"), Mapping):
        return str(spec["text_encoder"].get("name"))
    encoder = getattr(model_or_encoder, "text_encoder", model_or_encoder)
    return getattr(encoder, "component_name", type(encoder).__name__)
