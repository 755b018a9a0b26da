"""A shipped base head for the tiny target, and configs/retrain.yaml as the tests need it:
``cpu``'s base head set to a test's own or unset (the shipped one is SmolLM2's, which the
tiny target would refuse)."""

from __future__ import annotations

from pathlib import Path

import tasks.loop.retrain_config as retrain_config
from serving.target import LoadedTarget


def ship_tiny_head(lean: LoadedTarget, root: Path) -> Path:
    """A head trained on ``lean`` (the tiny target on the lean int4 step), scored and
    shipped as ``dvc repro base_ship`` ships one: ``root/base``."""
    from tasks.evaluate.head_score import score_head
    from tasks.evaluate.ship_head import ship_head
    from tasks.train.train_head import write_head_package
    from tests.tasks.lean_heads import lean_teacher_and_head

    teacher, config, result = lean_teacher_and_head(lean, root, prompts=8, new_tokens=16, seed=4)
    package = write_head_package(result, config, root / "package", k=4)
    (root / "score.json").write_text(score_head(package, teacher, lean, k=4).model_dump_json())
    ship_head(package, teacher, root / "score.json", root / "base")
    return root / "base"


def naming_base_head(monkeypatch, folder: Path | None) -> None:
    """Make every later ``load_retrain_config()`` the project's, with ``cpu``'s
    ``base_head`` set to ``folder`` (None: unset)."""
    config = retrain_config.load_retrain_config()
    cpu = config.targets["cpu"].model_copy(
        update={"base_head": None if folder is None else str(folder)}
    )
    changed = config.model_copy(update={"targets": {**config.targets, "cpu": cpu}})
    monkeypatch.setattr(retrain_config, "load_retrain_config", lambda path=None: changed)
