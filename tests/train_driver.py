"""Run a short training in a subprocess for the resume and kill tests.

``python train_driver.py DATA RUN [--kill-at STEP] [--resume]``: trains the tiny TERAN of
``conftest.tiny_spec`` (dropout on, so the random state matters) on the learnable data, with a
checkpoint every 4 steps; ``--kill-at`` sends this process SIGKILL right after that optimizer
step, the way a crash or a pre-empted job ends, with no chance to clean up.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

import xmatch  # noqa: E402
from conftest import FIXTURES, tiny_spec  # noqa: E402
from learnable import FEATURE_DIM  # noqa: E402
from xmatch.data import open_dataset  # noqa: E402
from xmatch.train import Callback, TrainConfig, Trainer  # noqa: E402


class KillAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, trainer, step, logs):
        if step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data", type=Path)
    parser.add_argument("run", type=Path)
    parser.add_argument("--kill-at", type=int)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)  # the trainer's messages
    torch.manual_seed(0)
    spec = tiny_spec(str(FIXTURES / "teran-original" / "mrsw-small" / "bert"))
    spec["image_encoder"]["feature_dim"] = FEATURE_DIM
    model = xmatch.build(spec)
    train = open_dataset("scan-precomp", args.data, split="train", boxes_normalized=True, max_images=24)
    val = open_dataset("scan-precomp", args.data, split="dev", boxes_normalized=True)
    config = TrainConfig(
        epochs=2, batch_size=16, lr=1e-3, checkpoint_every_steps=4, keep_checkpoints=3,
        log_every_steps=1, scheduler="cosine", warmup_steps=3, tensorboard=False,
    )
    callbacks = [KillAt(args.kill_at)] if args.kill_at else []
    Trainer(model, train, config, val_data=val, run_dir=args.run, resume=args.resume,
            progress=False, callbacks=callbacks).fit()


if __name__ == "__main__":
    main()
