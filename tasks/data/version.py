"""Version the live store with DVC: ``dvc add data`` then ``dvc push`` to the default remote.

The default remote is a local folder (``~/.cache/specops/dvc-remote``, see ``.dvc/config``);
point it at object storage with ``dvc remote add -d team s3://bucket/specops``. Running it
again with nothing new is a no-op for DVC.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from serving.errors import SpecOpsError


def _dvc() -> str:
    beside = Path(sys.executable).with_name("dvc")
    found = str(beside) if beside.exists() else shutil.which("dvc")
    if not found:
        raise SpecOpsError("dvc is not installed in this environment; run scripts/setup.sh")
    return found


def version_store(store: Path = Path("data"), *, push: bool = True, repo: Path = Path(".")) -> str:
    """Snapshot ``store`` into ``<store>.dvc`` (and push it); return the new content hash."""
    store = Path(store)
    if not (Path(repo) / store).is_dir():
        raise SpecOpsError(f"nothing to version: {str(store)!r} is not a folder")
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    commands = [[_dvc(), "add", str(store)]]
    if push:
        commands.append([_dvc(), "push", f"{store}.dvc"])
    for command in commands:
        done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SpecOpsError(f"`{' '.join(command[1:])}` failed: {done.stderr.strip()}")
    import yaml

    meta = yaml.safe_load((Path(repo) / f"{store}.dvc").read_text())
    return str(meta["outs"][0]["md5"])
