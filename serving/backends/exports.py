"""Reading a draft export (written by :mod:`tasks.evaluate.export`) where the backend runs.

Torch-free: the MLX environment has no torch, and the vLLM one should not need the
specops engine to load a draft.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from serving.backends.base import Speculation, UnsupportedDraftError
from serving.errors import ModelSourceError

EXPORT_MANIFEST = "export.json"
DRAFT_FOLDER = "draft"


def read_export(folder: str | Path) -> dict[str, Any]:
    folder = Path(folder)
    path = folder / EXPORT_MANIFEST
    if not path.is_file():
        raise ModelSourceError(
            f"{str(folder)!r} is not a draft export: {EXPORT_MANIFEST} is missing"
        )
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ModelSourceError(f"bad {EXPORT_MANIFEST} in {str(folder)!r}: {error}") from None


def load_export(folder: str | Path, backend: str) -> Speculation:
    """The speculation an export runs, its draft path made absolute; the export must be
    for ``backend``."""
    folder = Path(folder)
    record = read_export(folder)
    if record.get("backend") != backend:
        raise UnsupportedDraftError(
            f"the export at {str(folder)!r} is for backend {record.get('backend')!r}, not "
            f"{backend!r}; export the draft for {backend!r} first"
        )
    raw = dict(record["speculation"])
    if raw.get("draft_path"):
        draft = folder / raw["draft_path"]
        if not (draft / "config.json").is_file():
            raise ModelSourceError(f"the export at {str(folder)!r} lacks its draft model folder")
        raw["draft_path"] = str(draft.resolve())
    return Speculation.from_dict(raw)
