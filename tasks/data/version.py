"""Version the live store with DVC: ``dvc add data`` then ``dvc push`` to a remote.

The default remote is a local folder (``~/.cache/specops/dvc-remote``, see ``.dvc/config``);
a team's remote (SSH, S3, ...) is named per machine (``dvc remote add --local team URL``)
and chosen with ``remote=`` (``SPECOPS_DVC_REMOTE``; the local team stack names its SSH
remote ``team``). Running it again with nothing new is a no-op for DVC.
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


def _remote_url(remote: str | None, repo: Path, env: dict[str, str]) -> str:
    """The URL of ``remote`` (default: DVC's default remote), for error messages."""
    name = remote
    if name is None:
        done = subprocess.run(
            [_dvc(), "remote", "default"], cwd=repo, env=env, capture_output=True, text=True
        )
        name = done.stdout.strip() or "?"
    done = subprocess.run(
        [_dvc(), "config", f"remote.{name}.url"], cwd=repo, env=env, capture_output=True, text=True
    )
    return f"{name} ({done.stdout.strip() or 'no URL configured'})"


def version_store(
    store: Path = Path("data"),
    *,
    push: bool = True,
    repo: Path = Path("."),
    remote: str | None = None,
) -> str:
    """Snapshot ``store`` into ``<store>.dvc`` (and push it to ``remote``, default DVC's
    default remote); return the new content hash. A push that fails (the remote is
    unreachable) raises naming the remote's URL; ``<store>.dvc`` then records a version
    the remote does not hold yet, and the next run pushes it."""
    store = Path(store)
    if not (Path(repo) / store).is_dir():
        raise SpecOpsError(f"nothing to version: {str(store)!r} is not a folder")
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    commands = [[_dvc(), "add", str(store)]]
    if push:
        commands.append([_dvc(), "push", *(["-r", remote] if remote else []), f"{store}.dvc"])
    for command in commands:
        done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            where = ""
            if command[1] == "push":
                where = f" to remote {_remote_url(remote, Path(repo), env)}"
            raise SpecOpsError(f"`{' '.join(command[1:])}` failed{where}: {done.stderr.strip()}")
    import yaml

    meta = yaml.safe_load((Path(repo) / f"{store}.dvc").read_text())
    return str(meta["outs"][0]["md5"])
