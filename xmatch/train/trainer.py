"""One trainer for every model: any device, AMP, parameter groups, schedules, accumulation,
validation with best-model selection, exact resumption, and DDP through ``torchrun``."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import random
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader
from tqdm.contrib.logging import logging_redirect_tqdm

from xmatch.core.errors import XmatchError
from xmatch.data.base import ImageTextDataset
from xmatch.data.collate import collate
from xmatch.data.fit import check_images_fit
from xmatch.model.inputs import PairBatch
from xmatch.model.model import MatchingModel
from xmatch.core.progress import ProgressBar, progress_bar
from xmatch.train import checkpoint as ckpt
from xmatch.train.config import ConfigError, TrainConfig
from xmatch.train.distributed import Context, TrainStep, setup
from xmatch.train.errors import NonFiniteLossError, TrainingError
from xmatch.train.logs import CsvLog, TensorBoardLog, tensorboard_available
from xmatch.train.optim import build_optimizer, build_scheduler, lr_factor, plan_groups
from xmatch.io.run_folder import (
    RUN_FILE,
    RunFolderError,
    claim_for_new_run,
    data_fingerprint,
    new_run_record,
    read_run_record,
    refuse_links,
    resume_changes,
    write_run_record,
)
from xmatch.io.safe_load import JsonDepthError, load_json
from xmatch.train.negatives import CaptionNegatives, NegativeTexts, build_makers, tagger_for, training_groups
from xmatch.train.sampler import EpochBatches, epoch_sampler, group_units
from xmatch.train.selection import VERIFIER_FIGURES, check_metric_name, metric_value, minimised, trains_only_verifier
from xmatch.data.vocab import check_captions

logger = logging.getLogger(__name__)

#: candidates per query that a verifier model's validation re-ranks, beside the pooler's figures
VAL_RERANK = 20


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware (AVX512-BF16 or AMX tiles);
    without either, torch emulates them far slower than float32."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


class Callback:
    """Hooks into training; override what you need (every hook runs on every process).

    Example:
        >>> class PrintLoss(Callback):
        ...     def on_step_end(self, trainer, step, logs):
        ...         print(step, logs["loss"])
    """

    def on_step_end(self, trainer: Trainer, step: int, logs: dict[str, float]) -> None:
        """After optimizer step ``step`` (1-based count of steps done)."""

    def on_validation_end(self, trainer: Trainer, step: int, figures: dict[str, Any]) -> None:
        """After a validation (figures of :meth:`xmatch.eval.EvalResult.figures`)."""


@dataclass
class TrainResult:
    """What a finished run reports.

    Attributes:
        steps: optimizer steps done.
        epochs: complete epochs done.
        best_metric: the best validation value of ``select_metric`` (None without validation).
        best_step: the step of the best model.
        validations: ``{"step", "epoch", "metric", figures...}`` per validation.
        last_loss: the loss of the last logged step.
        stopped_early: early stopping ended the run.
        run_dir: the run folder (``final/`` and ``best/`` bundles, logs, checkpoints).
    """

    steps: int
    epochs: int
    best_metric: float | None
    best_step: int | None
    validations: list[dict[str, Any]] = field(default_factory=list)
    last_loss: float | None = None
    stopped_early: bool = False
    run_dir: Path | None = None


class Trainer:
    """Train a :class:`~xmatch.MatchingModel` on an image-caption dataset.

    Args:
        model: a model built by :func:`xmatch.build` (its spec goes into every checkpoint).
        train_data: a dataset of :mod:`xmatch.data` (pairs, ``collate``-able).
        config: the recipe (default: TERAN's, :class:`TrainConfig`).
        val_data: validation set (any :class:`xmatch.eval.RetrievalSet`); None: no validation.
        run_dir: where checkpoints, ``best/``, ``final/`` and the logs go.
        device: ``cpu``, ``cuda``, ``cuda:1``, ``mps`` (default: CUDA when available). Under
            ``torchrun`` each process takes its local GPU.
        resume: continue from the run folder's latest checkpoint. The recipe and data are
            compared with the run's record (``run.json``): a change that would alter the data
            order, the learning-rate trajectory or the selection metric is refused with the
            list of changes (:data:`xmatch.io.run_folder.SAFE_ON_RESUME` may change).
        overwrite: start a new run in a folder that holds one, removing the old run's files.
            Without it (and without ``resume``) a non-empty run folder is refused.
        force: resume even with recipe or data changes that are not safe (they are recorded
            in ``run.json``).
        progress: show progress bars.
        callbacks: :class:`Callback` objects; one can end the run cleanly (with a checkpoint)
            by setting ``trainer.stop_requested = True``.
        context: the process context of :func:`xmatch.train.distributed.setup` (default: set
            up here from ``device`` and the ``torchrun`` environment).

    Example:
        >>> model = xmatch.build("teran-mrsw-coco")  # trains on COCO (hours)  # doctest: +SKIP
        >>> train = xmatch.data.open_dataset("teran", "data/coco", split="train", restval=True)  # doctest: +SKIP
        >>> val = xmatch.data.open_dataset("teran", "data/coco", split="val", max_images=1000)  # doctest: +SKIP
        >>> Trainer(model, train, load_recipe("teran-coco"), val_data=val, run_dir="runs/teran").fit()  # doctest: +SKIP
    """

    def __init__(
        self,
        model: MatchingModel,
        train_data: Any,
        config: TrainConfig | None = None,
        *,
        val_data: Any | None = None,
        run_dir: str | Path = "runs/xmatch",
        device: str | torch.device | None = None,
        resume: bool = False,
        overwrite: bool = False,
        force: bool = False,
        progress: bool = True,
        callbacks: Sequence[Callback] = (),
        context: Context | None = None,
    ) -> None:
        self.config = config or TrainConfig()
        self.ctx = context or setup(device)
        self.model = model
        self.train_data = train_data
        self.val_data = val_data
        self.run_dir = Path(run_dir)
        self.resume = resume
        self.overwrite = overwrite
        self.force = force
        self.run_record: dict[str, Any] = {}
        self.progress = progress and self.ctx.is_main
        self.callbacks = list(callbacks)
        self.stop_requested = False
        #: (epoch, caption indices, negatives) of the next batch, drawn during the last micro-step
        self._negatives_ahead: tuple[int, torch.Tensor, NegativeTexts] | None = None
        self.verifier_record: dict[str, Any] | None = None  # the head's last validation, kept in its bundles
        _check_model(model)
        if not resume and not overwrite:  # refuse early, before data or weights are touched
            refusal = self.ctx.broadcast(claim_for_new_run(self.run_dir, overwrite=False) if self.ctx.is_main else None)
            if refusal is not None:
                raise RunFolderError(refusal)
        check_data_fits(model, train_data, "training", allow_unknown_words=self.config.allow_unknown_words)
        if val_data is not None:
            try:
                check_metric_name(self.config.select_metric, self.config.val_relevance, verifier=model.verifier is not None,
                                  verifier_only=trains_only_verifier(model, self.config.param_groups))
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        if isinstance(val_data, ImageTextDataset):
            check_data_fits(model, val_data, "validation", allow_unknown_words=self.config.allow_unknown_words)
        self._check_amp()
        self._plan_negatives()

    # -- set-up ------------------------------------------------------------------------------

    def _check_amp(self) -> None:
        amp, kind = self.config.amp, self.ctx.device.type
        if amp == "none":
            return
        if amp == "bf16" and kind == "cuda" and not torch.cuda.is_bf16_supported():
            raise ConfigError("train -> amp: this GPU has no bfloat16 support; use amp = 'fp16'.")
        if amp == "fp16" and kind == "cpu":
            raise ConfigError("train -> amp: fp16 needs a GPU; on the CPU use amp = 'bf16' or 'none'.")
        if not torch.amp.is_autocast_available(kind):
            raise ConfigError(f"train -> amp: autocast is not available on '{kind}'; use amp = 'none'.")
        if amp == "bf16" and kind == "cpu" and not cpu_has_native_bf16():
            logger.warning(
                "train -> amp: bf16 on a CPU without bfloat16 instructions (AVX512-BF16 or AMX): "
                "matrix products are emulated and run tens to hundreds of times slower than "
                "float32 here; use amp = 'none' on this machine."
            )

    def _plan_negatives(self) -> None:
        """The structural negatives of the recipe (refused before training when their word
        classes are missing) and, where the training set has hard-negative groups (a groups file,
        or the ones it declares), the units that batch each group's members together; a set
        without groups, with ``groups = true``, is warned about (its group terms stay 0)."""
        self.negatives: CaptionNegatives | None = None
        self.units: list[list[int]] | None = None
        self.group_of_image: torch.Tensor | None = None
        self.groups_record: dict[str, Any] | None = None
        plan = self.config.negatives
        if plan is None:
            return
        try:
            tagger = tagger_for(plan.word_classes, self.train_data)
            self.negatives = CaptionNegatives(build_makers(plan.kinds, tagger), plan.per_caption, self.config.seed)
        except (ValueError, ImportError, FileNotFoundError, XmatchError) as exc:
            raise ConfigError(f"train -> negatives: {exc}") from exc
        self._warm_parses(tagger)
        groups = training_groups(self.train_data, plan.groups_file) if plan.groups else []
        if plan.groups_file is not None:
            # the file's groups are training data: run.json records them, so a resume with other groups is refused
            digest = hashlib.sha256(json.dumps(groups).encode("utf-8")).hexdigest()
            self.groups_record = {"groups": len(groups), "groups_sha256": digest}
        if plan.groups and not groups and self.ctx.is_main:
            logger.warning(
                "train -> negatives -> groups = true, but the training set (%s) declares no hard-negative groups: "
                "the group terms stay 0 (negatives_groups in the log). List its groups in a JSON file (the format of "
                "xmatch eval --groups, docs/evaluation.md) and pass it with xmatch train --groups FILE "
                "(negatives.groups_file), or set negatives.groups = false.", type(self.train_data).__name__,
            )
        if groups:
            caption_image = np.asarray(self.train_data.caption_image)
            self.units = group_units(caption_image, groups)
            group_of_image = np.full(int(caption_image.max()) + 1, -1, dtype=np.int64)
            for k, members in enumerate(groups):
                group_of_image[[m for m in members if group_of_image[m] < 0]] = k
            self.group_of_image = torch.from_numpy(group_of_image)

    def _warm_parses(self, tagger: Any) -> None:
        """Every training caption parsed before the first step where the makers read a parse
        (the spaCy tagger): from the disk cache of this training set
        (:mod:`xmatch.train.parse_cache`), the others in batches and then cached. Parsed one by
        one inside the steps, they made the first epoch's steps dearer than the later ones, in
        every new run (docs/training.md, Throughput)."""
        from xmatch.eval.spacy_tagger import SpacyTagger

        captions = getattr(self.train_data, "captions", None)
        if not isinstance(tagger, SpacyTagger) or captions is None:
            return
        from xmatch.train.parse_cache import warm_tagger

        fingerprint = data_fingerprint(self.train_data)
        if self.ctx.is_main:  # one process parses and writes, the others read its file
            done = warm_tagger(tagger, captions, fingerprint)
            logger.info("parses of the training captions: %d read from %s, %d parsed", done.loaded, done.path, done.parsed)
        self.ctx.barrier()
        if not self.ctx.is_main:
            warm_tagger(tagger, captions, fingerprint, write=False)

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.config.amp == "none":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.config.amp == "bf16" else torch.float16
        return torch.autocast(self.ctx.device.type, dtype=dtype)

    def _prepare(self) -> None:
        cfg, ctx = self.config, self.ctx
        self.model.to(ctx.device)
        self.groups = plan_groups(self.model, cfg)
        self.optimizer = build_optimizer(self.groups, cfg)
        self.batches = EpochBatches(
            len(self.train_data), cfg.batch_size, cfg.seed,
            drop_last=cfg.drop_last, rank=ctx.rank, world_size=ctx.world_size, units=self.units,
        )
        self.steps_per_epoch = math.ceil(len(self.batches) / cfg.accumulate)
        self.scheduler = build_scheduler(self.optimizer, cfg, self.steps_per_epoch)
        # said, not rescaled: a recipe's warm-up means the same at every data size, and a resume
        # with other epochs or max_steps keeps the learning-rate trajectory it started with
        total = int(min(cfg.max_steps or math.inf, cfg.epochs * self.steps_per_epoch))
        if 2 * cfg.warmup_steps > total and ctx.is_main:
            warmup = cfg.warmup_steps
            logger.warning(
                "train -> warmup_steps: the linear warm-up (%d steps) covers %s optimizer steps of this run (%d per "
                "epoch): the learning rate %s. Shorten the warm-up (--set warmup_steps=%d, about a tenth of the run) "
                "or train longer (--set epochs=N).",
                warmup, f"all {total}" if warmup >= total else f"{warmup} of the {total}", self.steps_per_epoch,
                f"never reaches {cfg.lr:g}" if warmup > total else f"reaches {cfg.lr:g} only at step {warmup}",
                max(1, total // 10),
            )
        if cfg.scheduler == "cosine" and total < cfg.epochs * self.steps_per_epoch and ctx.is_main:
            self._warn_cosine_cut(total)
        use_scaler = cfg.amp == "fp16"
        self.scaler = torch.amp.GradScaler(ctx.device.type) if use_scaler else None
        plan = cfg.negatives
        step = TrainStep(self.model, ctx, cfg.global_negatives, plan.margin if plan else None, plan.weight if plan else 1.0)
        self.loss_scale = step.loss_scale
        if ctx.distributed:
            from torch.nn.parallel import DistributedDataParallel

            ids = [ctx.device.index] if ctx.device.type == "cuda" else None
            step = DistributedDataParallel(step, device_ids=ids)
        self.step_module = step
        self.relevance = self._validation_relevance()

    def _validation_relevance(self) -> dict[str, np.ndarray]:
        if self.val_data is None or not self.config.val_relevance or not self.ctx.is_main:
            return {}
        from xmatch.eval.relevance import relevance_matrix

        return {
            name.lower(): relevance_matrix(
                self.val_data.captions, name.lower(), self.val_data.captions_per_image,
                cache_dir=self.run_dir / "relevance",
            )
            for name in self.config.val_relevance
        }

    # -- state -------------------------------------------------------------------------------

    def _claim_run_folder(self, replace: bool) -> None:
        """Start a new run's record in the run folder; a folder holding anything is refused
        unless ``replace`` (then the old run's files go)."""
        refusal = None
        if self.ctx.is_main:
            refusal = claim_for_new_run(self.run_dir, replace)
            if refusal is None:
                self.run_dir.mkdir(parents=True, exist_ok=True)
                self.run_record = new_run_record(self.model.spec, self.config.to_mapping(), self._data_record(),
                                                 self.ctx.world_size)
                write_run_record(self.run_dir, self.run_record)
        refusal = self.ctx.broadcast(refusal)
        if refusal is not None:
            raise RunFolderError(refusal)

    def _fresh_state(self) -> dict[str, Any]:
        seed = self.config.seed + self.ctx.rank
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
        return {"epoch": 0, "batch": 0, "step": 0, "best": None, "best_step": None, "bad_validations": 0,
                "validations": []}

    def _data_record(self) -> dict[str, Any]:
        record = {"train": data_fingerprint(self.train_data), "val": data_fingerprint(self.val_data)}
        if self.groups_record is not None:
            record["groups"] = self.groups_record
        return record

    def _restored_state(self) -> dict[str, Any] | None:
        candidates = ckpt.checkpoint_candidates(self.run_dir)
        if not candidates:
            return None
        record = read_run_record(self.run_dir) or {}
        self._check_resume_fits(record)
        state, folder = self._read_first_usable(candidates)
        self.model.to(self.ctx.device)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        rng = state["rng"]
        if len(rng) == self.ctx.world_size:
            ckpt.restore_rng(rng[self.ctx.rank], self.ctx.device)
        else:
            seed = self.config.seed + self.ctx.rank + state["step"]
            torch.manual_seed(seed)
            if self.ctx.is_main:
                logger.info("resuming %d processes' run on %d: the data order continues exactly, dropout "
                            "draws are reseeded", len(rng), self.ctx.world_size)
        if self.ctx.is_main:
            logger.info("resuming from %s (epoch %d, batch %d, step %d)", folder, state["epoch"] + 1, state["batch"], state["step"])
        return state

    def _recorded_validations(self, text: str) -> list[Any]:
        """The validations a trainer state records (JSON text), read with a bounded depth."""
        try:
            return load_json(text, f"the validations recorded in the checkpoint of {self.run_dir}")
        except (JsonDepthError, json.JSONDecodeError) as exc:
            raise ckpt.CheckpointError(f"{exc} Resume from another checkpoint or start a new run.") from None

    def _check_resume_fits(self, record: dict[str, Any]) -> None:
        """Refuse a resume whose spec, recipe or data differ from the run's record in ways that
        matter; record the accepted changes."""
        run_file = self.run_dir / RUN_FILE
        if "spec" in record and json.dumps(record["spec"], sort_keys=True) != json.dumps(self.model.spec, sort_keys=True):
            raise RunFolderError(
                f"{self.run_dir} was started with another model spec ({run_file}); resume with "
                "the same spec, or start a new run folder."
            )
        train, data = self.config.to_mapping(), self._data_record()
        if isinstance(record.get("train"), dict):
            # a setting added to xmatch after the run started ran at its default value
            record = {**record, "train": {**TrainConfig().to_mapping(), **record["train"]}}
        safe, unsafe = resume_changes(record, train, data)
        if unsafe and not self.force:
            raise RunFolderError(
                f"resuming {self.run_dir} with changes that would not continue the same run:\n  "
                + "\n  ".join(unsafe)
                + "\nResume with the recorded recipe and data (see " + str(run_file) + "), start a new "
                "run folder, or pass --force (force=True) to resume anyway. Settings that may change on "
                "resume: epochs (not with the cosine schedule), max_steps, num_workers, log_every_steps, "
                "tensorboard, keep_checkpoints, checkpoint_every_steps, val_every_steps, early_stopping, "
                "allow_unknown_words, text_min_count (a resumed run reuses its text side)."
            )
        self.run_record = {**record, "train": train, "data": data, "world_size": self.ctx.world_size}
        self.run_record.setdefault("run_id", None)
        if (safe or unsafe) and self.ctx.is_main:
            changes = safe + unsafe
            logger.warning("resuming %s with changed settings:\n  %s", self.run_dir, "\n  ".join(changes))
            self.run_record["resumes"] = [*record.get("resumes", []), {"changes": changes, "forced": bool(unsafe)}]
            write_run_record(self.run_dir, self.run_record)

    def _read_first_usable(self, candidates: list[Path]) -> tuple[dict[str, Any], Path]:
        """The newest checkpoint that reads; a damaged one is named and the previous kept one used."""
        failures = []
        for folder in candidates:
            try:
                return ckpt.read_checkpoint(folder, self.model), folder
            except ckpt.CheckpointError as exc:
                failures.append(str(exc))
                if self.ctx.is_main:
                    logger.warning("%s; falling back to the previous kept checkpoint", exc)
        raise TrainingError(
            "no checkpoint of " + str(self.run_dir) + " can be read:\n  " + "\n  ".join(failures)
            + "\nStart a new run (--overwrite) or restore the files from a backup."
        )

    def _save(self, state: dict[str, Any]) -> None:
        rng = self.ctx.gather_objects(ckpt.capture_rng(self.ctx.device))
        if self.ctx.is_main:
            payload = {
                **{k: state[k] for k in ("epoch", "batch", "step", "best", "best_step", "bad_validations")},
                "validations": json.dumps(state["validations"]),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler is not None else {},
                "rng": rng,
                "world_size": self.ctx.world_size,
            }
            ckpt.write_checkpoint(self.run_dir, state["step"], self.model, payload, self.config.keep_checkpoints,
                                  run_id=self.run_record.get("run_id"))
        self.ctx.barrier()

    # -- the loop ----------------------------------------------------------------------------

    def fit(self) -> TrainResult:
        """Train to the end of the recipe (or early stopping, or ``max_steps``).

        Raises:
            NonFiniteLossError: the loss became NaN/inf (the last good checkpoint is kept).
            TrainingError: out of memory (with advice) or a resume that does not fit.
        """
        cfg, ctx = self.config, self.ctx
        if self.resume:  # before anything of the old run is read: no link inside the folder is followed
            refuse_links(self.run_dir)
        else:
            self._claim_run_folder(replace=self.overwrite)
        self._prepare()
        restored = self._restored_state() if self.resume else None
        if self.resume and restored is None:
            if ctx.is_main:
                logger.info("no checkpoint in %s: starting a new run", self.run_dir)
            # nothing of the old run can be continued: its logs and record are replaced
            self._claim_run_folder(replace=True)
        state = restored or self._fresh_state()
        if isinstance(state["validations"], str):
            state["validations"] = self._recorded_validations(state["validations"])
        self._open_logs(state["step"] if restored else None)
        total = min(cfg.max_steps or math.inf, cfg.epochs * self.steps_per_epoch)
        bar = progress_bar(total=total, initial=state["step"], desc="train", unit="step", show=self.progress,
                           dynamic_ncols=True)
        last_loss: float | None = None
        stopped_early = False
        self.model.train()
        try:
            while state["epoch"] < cfg.epochs and not self._budget_spent(state):
                last_loss = self._run_epoch(state, bar) or last_loss
                if state["batch"] < len(self.batches):  # stopped inside the epoch (max_steps, stop_requested)
                    self._save(state)
                    break
                state["epoch"] += 1
                state["batch"] = 0
                if self.val_data is not None and not self._budget_spent(state):
                    self._validate(state)
                self._save(state)
                if cfg.early_stopping and state["bad_validations"] >= cfg.early_stopping:
                    stopped_early = True
                    if ctx.is_main:
                        logger.info("early stopping: no better %s for %d validations", cfg.select_metric, cfg.early_stopping)
                    break
                if self.stop_requested:
                    break
        finally:
            bar.close()
            self._close_logs()
        if ctx.is_main:
            # the head's record describes these weights only when the last validation saw them
            record = self.verifier_record if self.verifier_record and self.verifier_record["step"] == state["step"] else None
            ckpt.write_bundle(self.run_dir / "final", self.model, verifier_validation=record)
        ctx.barrier()
        return TrainResult(
            steps=state["step"], epochs=state["epoch"], best_metric=state["best"], best_step=state["best_step"],
            validations=state["validations"], last_loss=last_loss, stopped_early=stopped_early, run_dir=self.run_dir,
        )

    def _budget_spent(self, state: dict[str, Any]) -> bool:
        return self.config.max_steps is not None and state["step"] >= self.config.max_steps

    def _loader(self, epoch: int, start: int) -> DataLoader:
        # a private generator: creating the iterator must not draw from the global RNG, or a
        # resumed run's dropout would diverge from the uninterrupted run's
        # pinned batches make the copy to a GPU asynchronous (from pageable memory it waits for
        # the device to finish the previous step)
        return DataLoader(
            self.train_data, batch_sampler=epoch_sampler(self.batches, epoch, start), collate_fn=collate,
            num_workers=self.config.num_workers, generator=torch.Generator().manual_seed(self.config.seed + epoch),
            pin_memory=self.ctx.device.type == "cuda",
        )

    def _run_epoch(self, state: dict[str, Any], bar: ProgressBar) -> float | None:
        cfg = self.config
        n_batches = len(self.batches)
        window: dict[str, list[float]] = {}
        window_start, window_pairs = time.perf_counter(), 0
        step_start, step_pairs = time.perf_counter(), 0
        last_loss = None
        for batch, upcoming in _with_next(self._loader(state["epoch"], state["batch"])):
            b = state["batch"]
            group_start = b - b % cfg.accumulate
            group_len = min(cfg.accumulate, n_batches - group_start)
            last_in_group = b - group_start == group_len - 1
            with self._drawing_ahead(upcoming, state["epoch"]):
                logs = self._micro_step(batch, state, group_len, last_in_group)
            for k, v in logs.items():
                window.setdefault(k, []).append(v)
            window_pairs += len(batch) * self.ctx.world_size
            step_pairs += len(batch) * self.ctx.world_size
            state["batch"] += 1
            if not last_in_group:
                continue
            self._optimizer_step()
            state["step"] += 1
            step = state["step"]
            bar.update(1)
            means = self.ctx.mean({k: float(np.mean(v)) for k, v in window.items()})
            window.clear()
            last_loss = means.get("loss", last_loss)
            if step % cfg.log_every_steps == 0 or step == 1:
                elapsed = time.perf_counter() - window_start
                self._log_step(state, means, window_pairs / max(elapsed, 1e-9))
                window_start, window_pairs = time.perf_counter(), 0
            now = time.perf_counter()
            bar.set_postfix(loss=f"{means['loss']:.4f}", lr=f"{self.scheduler.get_last_lr()[0]:.2e}",
                            pairs_s=f"{step_pairs / max(now - step_start, 1e-9):.1f}", epoch=state["epoch"] + 1,
                            refresh=False)
            step_start, step_pairs = now, 0
            for cb in self.callbacks:
                cb.on_step_end(self, step, means)
            at_epoch_end = state["batch"] == n_batches
            if cfg.val_every_steps and step % cfg.val_every_steps == 0 and not at_epoch_end and self.val_data is not None:
                self._validate(state)
            if cfg.checkpoint_every_steps and step % cfg.checkpoint_every_steps == 0 and not at_epoch_end:
                self._save(state)
            if self._budget_spent(state) or self.stop_requested:
                break
        return last_loss

    @contextlib.contextmanager
    def _drawing_ahead(self, upcoming: PairBatch | None, epoch: int) -> Iterator[None]:
        """Draw the next batch's structural negatives in a thread while this micro-step computes:
        torch releases the GIL in its kernels, and the negatives' makers and validity check
        (with spaCy, a parse of every negative) took a sixth to a third of a step on the main
        thread; where a core is free they cost nothing then. The thread
        ends with the step, so nothing else (a validation) uses the tagger at the same time; the
        negatives depend only on (seed, epoch, caption), so drawn ahead they are the same."""
        if self.negatives is None or upcoming is None or upcoming.indices is None:
            yield
            return
        drawn: list[NegativeTexts] = []

        def draw() -> None:
            # an error is raised where the batch's negatives are drawn again, on the main thread
            with contextlib.suppress(Exception):
                drawn.append(self.negatives.draw(upcoming.texts, upcoming.indices, epoch))

        thread = threading.Thread(target=draw, name="xmatch-negatives", daemon=True)
        thread.start()
        try:
            yield
        finally:
            thread.join()
            self._negatives_ahead = (epoch, upcoming.indices, drawn[0]) if drawn else None

    def _negatives_of(self, batch: PairBatch, epoch: int) -> NegativeTexts:
        """The batch's structural negatives: those drawn ahead during the previous micro-step
        (:meth:`_drawing_ahead`) when they are this batch's, else drawn now."""
        ahead, self._negatives_ahead = self._negatives_ahead, None
        if ahead is not None and ahead[0] == epoch and torch.equal(ahead[1], batch.indices):
            return ahead[2]
        return self.negatives.draw(batch.texts, batch.indices, epoch)

    def _micro_step(self, batch: PairBatch, state: dict[str, Any], group_len: int, last: bool) -> dict[str, float]:
        extras: dict[str, Any] = {}
        if self.negatives is not None:
            extras["negatives"] = self._negatives_of(batch, state["epoch"])
        if self.group_of_image is not None:
            extras["group_ids"] = self.group_of_image[batch.image_ids].to(self.ctx.device, non_blocking=True)
        batch = batch.to(self.ctx.device, non_blocking=True)
        sync = contextlib.nullcontext() if last or not self.ctx.distributed else self.step_module.no_sync()
        try:
            with sync:
                with self._autocast():
                    out = self.step_module(batch, **extras)
                loss = out.loss.float()
                scaled = loss * self.loss_scale / group_len
                (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
                # One wait for the device per micro-step, once backward is queued: the finiteness
                # check and the logged figures are read together. A non-finite loss still stops
                # the run before the optimizer applies anything.
                names = ["loss", *out.logs]
                values = torch.stack([loss.detach(), *(
                    torch.as_tensor(v, dtype=torch.float32, device=loss.device).detach() for v in out.logs.values()
                )]).tolist()
                finite = math.isfinite(values[0])
                if self.ctx.any(not finite):
                    indices = batch.indices.tolist() if batch.indices is not None else []
                    raise NonFiniteLossError(
                        f"the loss is {values[0]} at step {state['step'] + 1} (epoch {state['epoch'] + 1}, "
                        f"process {self.ctx.rank}'s caption indices {indices}); nothing of this step was "
                        f"applied and the last good checkpoint in {self.run_dir / 'checkpoints'} is kept. "
                        "Check those captions/images for bad values, lower the learning rate or turn off fp16.",
                        state["step"], state["epoch"], indices,
                    )
        except torch.OutOfMemoryError as exc:
            raise TrainingError(
                f"out of memory at step {state['step'] + 1} with a batch of {len(batch)} pairs on "
                f"{self.ctx.device}: lower train.batch_size and raise train.accumulate, use amp = 'bf16' "
                "or 'fp16' on a GPU, or freeze the text encoder (finetune = false)."
            ) from exc
        return dict(zip(names, values))

    def _optimizer_step(self) -> None:
        cfg = self.config
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if cfg.grad_clip is not None:
            params = [p for g in self.groups for p in g.params]
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        try:
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
        except RuntimeError as exc:
            if "overflow" not in str(exc):
                raise
            raise TrainingError(
                f"the optimizer step overflowed ({exc}); the learning rate {cfg.lr:g} (or a group's "
                "lr_scale) is far too large: lower train.lr."
            ) from None
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()

    # -- validation --------------------------------------------------------------------------

    def _validate(self, state: dict[str, Any]) -> None:
        from xmatch.eval import evaluate

        cfg = self.config
        payload = None
        if self.ctx.is_main:
            if self.model.verifier is not None:
                # the head's own figures, and the pooler's beside the re-ranked ones, from one encoding
                validation = self._validate_verifier()
                figures = validation.figures()
                self.verifier_record = validation.record(getattr(self.val_data, "split", None), state["step"])
            else:
                result = evaluate(self.model, self.val_data, cfg.val_protocol, relevance=self.relevance, progress=False)
                figures = result.figures()
            payload = (metric_value(figures, cfg.select_metric), figures)
        self.model.train()
        value, figures = self.ctx.broadcast(payload)
        best = state["best"]
        better = best is None or (value < best if minimised(cfg.select_metric) else value > best)
        record = {"step": state["step"], "epoch": state["epoch"], "metric": value, **_flat(figures)}
        state["validations"].append(record)
        if better:
            state["best"], state["best_step"], state["bad_validations"] = value, state["step"], 0
            if self.ctx.is_main:
                ckpt.write_bundle(self.run_dir / "best", self.model, {"metrics.json": json.dumps(record, indent=1)},
                                  verifier_validation=self.verifier_record)
        else:
            state["bad_validations"] += 1
        if self.ctx.is_main:
            self.val_log.write(record)
            if self.tb is not None:
                self.tb.write(state["step"], {k: v for k, v in record.items() if isinstance(v, float)}, "val")
            mark = " (best)" if better else ""
            with logging_redirect_tqdm() if self.progress else contextlib.nullcontext():  # keeps the bar whole
                logger.info("validation at step %d: %s = %.4f%s", state["step"], cfg.select_metric, value, mark)
                if "verifier" in figures:
                    logger.info("%s", _verifier_line(figures))
        for cb in self.callbacks:
            cb.on_validation_end(self, state["step"], figures)

    def _validate_verifier(self) -> Any:
        """The verifier head's validation (:func:`~xmatch.train.verifier_validation.validate_verifier`)
        with the recipe's structural negatives and the split's declared groups."""
        from xmatch.eval.groups import dataset_groups
        from xmatch.train.verifier_validation import validate_verifier

        if not hasattr(self, "val_groups"):
            declared = getattr(self.val_data, "hard_negative_groups", None) is not None
            self.val_groups = dataset_groups(self.val_data) if declared else None
        return validate_verifier(self.model, self.val_data, k=VAL_RERANK, recall=self.config.val_protocol,
                                 negatives=self.negatives, groups=self.val_groups, relevance=self.relevance)

    # -- logs --------------------------------------------------------------------------------

    def _open_logs(self, resume_step: int | None) -> None:
        self.train_log = self.val_log = None
        self.tb = None
        if not self.ctx.is_main:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.train_log = CsvLog(self.run_dir / "train.csv", resume_step)
        self.val_log = CsvLog(self.run_dir / "val.csv", resume_step)
        want_tb = self.config.tensorboard
        if want_tb is None:
            want_tb = tensorboard_available()
        if want_tb:
            if not tensorboard_available():
                raise ConfigError("train -> tensorboard = true but the tensorboard package is not installed: pip install tensorboard.")
            self.tb = TensorBoardLog(self.run_dir / "tensorboard", resume_step)

    def _warn_cosine_cut(self, total: int) -> None:
        """Say when ``max_steps`` stops a cosine schedule before it has come half-way down: the
        schedule runs over ``epochs`` (so that a resume with another ``max_steps`` keeps its
        learning rates), and a step budget does not end it."""
        cfg = self.config
        end = lr_factor(total - 1, cfg, self.steps_per_epoch)
        if end < 0.5:
            return
        logger.warning(
            "train -> max_steps: the cosine schedule decays over the recipe's %d epochs (%d optimizer steps), and "
            "max_steps = %d stops the run with the learning rate still at %.0f %% of %g. For a decay that ends with "
            "the run, set the epochs to cover the steps (--set epochs=%d) or use a constant rate "
            "(--set scheduler='\"constant\"').",
            cfg.epochs, cfg.epochs * self.steps_per_epoch, total, 100 * end, cfg.lr,
            math.ceil(total / self.steps_per_epoch),
        )

    def _log_step(self, state: dict[str, Any], means: dict[str, float], pairs_per_s: float) -> None:
        if not self.ctx.is_main:
            return
        lrs = self.scheduler.get_last_lr()
        row = {"step": state["step"], "epoch": state["epoch"] + state["batch"] / len(self.batches),
               "lr": lrs[0], **means, "pairs_per_s": pairs_per_s}
        self.train_log.write(row)
        if self.tb is not None:
            self.tb.write(state["step"], {k: float(v) for k, v in row.items() if k != "step"}, "train")

    def _close_logs(self) -> None:
        if self.tb is not None:
            self.tb.close()


def _with_next(batches: Iterable[PairBatch]) -> Iterator[tuple[PairBatch, PairBatch | None]]:
    """Each batch with the one after it (None for the last): the next batch's negatives are
    drawn while this one trains.

    Example:
        >>> list(_with_next([1, 2, 3]))
        [(1, 2), (2, 3), (3, None)]
    """
    it = iter(batches)
    current = next(it, None)
    while current is not None:
        upcoming = next(it, None)
        yield current, upcoming
        current = upcoming


def _flat(figures: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"rsum": figures["rsum"]}
    for direction in ("i2t", "t2i"):
        out.update({f"{direction}_{k}": v for k, v in figures[direction].items()})
    verifier = figures.get("verifier")
    if verifier:  # the head's figures, and the re-ranked rsum beside the pooler's rsum above
        out.update({name: verifier[key] for name, key in VERIFIER_FIGURES.items() if verifier.get(key) is not None})
        out["verifier_chance"] = verifier["chance"]
        out["rerank_lowered"] = ";".join(verifier["lowered"])
    return out


def _verifier_line(figures: dict[str, Any]) -> str:
    """One log line of a verifier head's validation: its accuracy beside chance, the twins, and
    the re-ranked rsum beside the pooler's (said when re-ranking lowers the pooler's figures)."""
    v = figures["verifier"]
    parts = [f"verifier accuracy {v['accuracy']:.1f} % (chance {v['chance']:.0f} %, {v['pairs']} pairs)"]
    if v.get("twins") is not None:
        parts.append(f"twins t2i {v['twins']:.1f} % (chance {v['twins_chance']:.1f} %)")
    if v.get("rerank_rsum") is not None:
        parts.append(f"rsum re-ranked top {v['k']} {v['rerank_rsum']:.1f} beside the pooler's {figures['rsum']:.1f}")
    if v["lowered"]:
        parts.append(f"re-ranking LOWERS the pooler's {', '.join(v['lowered'])}")
    return "; ".join(parts)


def _check_model(model: Any) -> None:
    if not isinstance(model, MatchingModel):
        raise TypeError(f"Trainer trains an xmatch MatchingModel (xmatch.build(...)), got {type(model).__name__}.")
    try:
        model.spec
    except AttributeError:
        raise TypeError("Trainer needs a model built from a spec (xmatch.build); its checkpoints store the spec.") from None
    if model.loss is None:
        raise TypeError("Trainer needs a model with a loss; this one is an inference build (loss=None): build it with a [loss] table.")


def check_data_fits(model: MatchingModel, dataset: Any, role: str, *, allow_unknown_words: bool = False) -> None:
    """Fail before training when the dataset's images do not fit the image encoder
    (precomputed regions vs pixels, region feature width), or when too many caption tokens are
    unknown to the text encoder (:func:`xmatch.data.vocab.check_captions`: a warning above 5 %, an
    error above 20 % unless ``allow_unknown_words``)."""
    if len(dataset) == 0:
        raise ValueError(f"the {role} set is empty.")
    check_images_fit(model, dataset, role)
    captions = getattr(dataset, "captions", None)
    if captions is not None:
        check_captions(model, captions, role, allow=allow_unknown_words)
