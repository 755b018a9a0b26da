"""A teacher cache answered and featured on a tiny lean target, and a head trained 4 deep on
it: the data and the head of the score and ship tests."""

from __future__ import annotations

from pathlib import Path

import torch

from serving.target import LoadedTarget
from tasks.train.teacher import TeacherConfig
from tasks.train.teacher_build import TeacherPrompt, build_teacher_cache
from tasks.train.train_head import TrainHeadConfig, TrainResult, train_head

EOS = 2


def lean_teacher_and_head(
    lean: LoadedTarget, root: Path, *, prompts: int, new_tokens: int, seed: int
) -> tuple[Path, TrainHeadConfig, TrainResult]:
    """``prompts`` random 6-token prompts answered (``new_tokens``, EOS ``2``) and featured
    on ``lean`` under ``root/teacher``; a head trained on them for 60 steps."""
    generator = torch.Generator().manual_seed(seed)
    chosen = [
        TeacherPrompt(f"p{i}", torch.randint(3, 96, (6,), generator=generator).tolist())
        for i in range(prompts)
    ]
    teacher = root / "teacher"
    build_teacher_cache(
        lean, chosen, teacher, eos_token_ids=[EOS],
        config=TeacherConfig(max_new_tokens=new_tokens, feature_dtype="float32"), progress=False,
    )  # fmt: skip
    config = TrainHeadConfig(
        teacher_dir=teacher, output_dir=root / "run", max_steps=60, batch_size=4,
        learning_rate=1e-2, token_weight=1.0, intermediate_size=64, eval_fraction=0.0,
        eval_every=60, checkpoint_every=60, depths=4,
    )  # fmt: skip
    return teacher, config, train_head(config, lean.model, progress=False)
