"""One trainer for every model: any device, AMP, parameter groups, schedules, accumulation,
validation with best-model selection, exact resumption, and DDP through ``torchrun``."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import time
from collections.abc import Sequence
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
from xmatch.train.optim import build_optimizer, build_scheduler, plan_groups
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
from xmatch.train.negatives import CaptionNegatives, build_makers, tagger_for, training_groups
from xmatch.train.sampler import EpochBatches, epoch_sampler, group_units
from xmatch.train.selection import check_metric_name, metric_value, minimised
from xmatch.data.vocab import check_captions

logger = logging.getLogger(__name__)


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
        _check_model(model)
        if not resume and not overwrite:  # refuse early, before data or weights are touched
            refusal = self.ctx.broadcast(claim_for_new_run(self.run_dir, overwrite=False) if self.ctx.is_main else None)
            if refusal is not None:
                raise RunFolderError(refusal)
        check_data_fits(model, train_data, "training", allow_unknown_words=self.config.allow_unknown_words)
        if val_data is not None:
            check_metric_name(self.config.select_metric, self.config.val_relevance)
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
        classes are missing) and, where the training set declares hard-negative groups, the
        units that batch each group's members together."""
        self.negatives: CaptionNegatives | None = None
        self.units: list[list[int]] | None = None
        self.group_of_image: torch.Tensor | None = None
        plan = self.config.negatives
        if plan is None:
            return
        try:
            tagger = tagger_for(plan.word_classes, self.train_data)
            self.negatives = CaptionNegatives(build_makers(plan.kinds, tagger), plan.per_caption, self.config.seed)
        except (ValueError, ImportError, FileNotFoundError, XmatchError) as exc:
            raise ConfigError(f"train -> negatives: {exc}") from exc
        groups = training_groups(self.train_data) if plan.groups else []
        if groups:
            caption_image = np.asarray(self.train_data.caption_image)
            self.units = group_units(caption_image, groups)
            group_of_image = np.full(int(caption_image.max()) + 1, -1, dtype=np.int64)
            for k, members in enumerate(groups):
                group_of_image[[m for m in members if group_of_image[m] < 0]] = k
            self.group_of_image = torch.from_numpy(group_of_image)

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
        return {"train": data_fingerprint(self.train_data), "val": data_fingerprint(self.val_data)}

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
            ckpt.write_bundle(self.run_dir / "final", self.model)
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
        for batch in self._loader(state["epoch"], state["batch"]):
            b = state["batch"]
            group_start = b - b % cfg.accumulate
            group_len = min(cfg.accumulate, n_batches - group_start)
            last_in_group = b - group_start == group_len - 1
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

    def _micro_step(self, batch: PairBatch, state: dict[str, Any], group_len: int, last: bool) -> dict[str, float]:
        extras: dict[str, Any] = {}
        if self.negatives is not None:
            extras["negatives"] = self.negatives.draw(batch.texts, batch.indices, state["epoch"])
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
                ckpt.write_bundle(self.run_dir / "best", self.model, {"metrics.json": json.dumps(record, indent=1)})
        else:
            state["bad_validations"] += 1
        if self.ctx.is_main:
            self.val_log.write(record)
            if self.tb is not None:
                self.tb.write(state["step"], {k: v for k, v in record.items() if isinstance(v, float)}, "val")
            mark = " (best)" if better else ""
            with logging_redirect_tqdm() if self.progress else contextlib.nullcontext():  # keeps the bar whole
                logger.info("validation at step %d: %s = %.4f%s", state["step"], cfg.select_metric, value, mark)
        for cb in self.callbacks:
            cb.on_validation_end(self, state["step"], figures)

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


def _flat(figures: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"rsum": figures["rsum"]}
    for direction in ("i2t", "t2i"):
        out.update({f"{direction}_{k}": v for k, v in figures[direction].items()})
    return out


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
