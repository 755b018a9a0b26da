"""Data lineage of a trained challenger: which data and which code made it.

Tagged on every registered challenger (``data_version``, ``git_commit``), so a version in
the registry can be traced back to the store snapshot (``dvc checkout`` of that version)
and the code that trained it.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import yaml

from serving.paths import PROJECT_ROOT
from serving.records import store as record_store
from tasks.data.version import pointer


def data_version(store: Path) -> str:
    """``dvc:<md5>`` when the store's pointer tracks it (``<store>.dvc``, or
    ``stores/<name>.dvc`` for a store outside the repository:
    :func:`tasks.data.version.pointer`), beside ``parts:<sha256>`` over the committed part
    files (name and bytes), which alone is the id of a store outside DVC (the demo's):
    changed since ``dvc add``, it still gets an exact id."""
    store = Path(store)
    digest = hashlib.sha256()
    for part in record_store.part_files(store):
        digest.update(str(part.relative_to(store)).encode())
        digest.update(hashlib.sha256(part.read_bytes()).digest())
    parts = f"parts:{digest.hexdigest()[:16]}"
    meta = pointer(store)
    if not meta.is_file():
        return parts
    try:
        content = yaml.safe_load(meta.read_text())
        recorded = content["outs"][0]
        source = (content.get("meta") or {}).get("source")
    except (OSError, yaml.YAMLError, KeyError, IndexError, TypeError, AttributeError):
        return parts
    if source is not None and source != str(store.resolve()):
        return parts  # the pointer of another store outside the repository
    # DVC's md5 covers the folder as added; the part digest says whether it still is.
    return f"dvc:{recorded.get('md5', '?')} {parts}"


def git_commit(repo: Path = PROJECT_ROOT) -> str:
    """The checked-out commit, ``+dirty`` when tracked files differ from it; ``unknown``
    outside a git checkout."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=repo,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def lineage_tags(store: Path) -> dict[str, str]:
    return {"data_version": data_version(store), "git_commit": git_commit()}
