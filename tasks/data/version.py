"""Version the live store with DVC, wherever it lives; the version pointer is always a
``.dvc`` file of this repository.

- A store inside the repository (``data``): ``dvc add data`` then ``dvc push``; the pointer
  is ``data.dvc``, the content also sits in the local DVC cache.
- A store outside it (another disk, a mounted ``/raid``): ``dvc add <store> --to-remote
  --out stores/<name>``: DVC hashes the folder where it is and sends it straight to the
  remote, never copying it into the checkout or its cache; the pointer is
  ``stores/<name>.dvc``, which records the store's path under ``meta.source``. ``git
  checkout <commit>`` then ``dvc pull stores/<name>.dvc`` restores that version into
  ``stores/<name>``; ``dvc get . stores/<name> --rev <commit> -o <folder>`` restores it
  anywhere (``docs/data.md``).

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

import yaml

from serving.errors import SpecOpsError

# The pointers of the stores outside the repository, relative to its root.
OUTSIDE_POINTERS = Path("stores")


class VersionError(SpecOpsError):
    """Versioning failed. ``retryable``: whether the same call can succeed later (a remote
    that was unreachable, a DVC lock another process held); otherwise DVC refused the data
    or the paths, and running it again repeats the refusal."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


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


def _inside(store: Path, repo: Path) -> Path | None:
    """``store`` relative to ``repo`` when it lies inside it, else None."""
    full = store if store.is_absolute() else repo / store
    try:
        return full.resolve().relative_to(repo.resolve())
    except ValueError:
        return None


def pointer(store: Path, repo: Path = Path(".")) -> Path:
    """The ``.dvc`` file that versions ``store``, relative to ``repo``: ``<store>.dvc``
    beside a store inside the repository, ``stores/<folder name>.dvc`` for one outside."""
    store, repo = Path(store), Path(repo)
    inside = _inside(store, repo)
    if inside is not None:
        return inside.with_name(inside.name + ".dvc")
    return OUTSIDE_POINTERS / f"{store.resolve().name}.dvc"


def _recorded_source(meta_file: Path) -> str | None:
    if not meta_file.is_file():
        return None
    meta = yaml.safe_load(meta_file.read_text()) or {}
    source = (meta.get("meta") or {}).get("source")
    return None if source is None else str(source)


def _run(
    command: list[str],
    repo: Path,
    env: dict[str, str],
    *,
    remote: str | None,
    sends: bool,
    retry_any: bool = False,
) -> None:
    """Run one DVC command; a failure raises :class:`VersionError`, naming the remote's URL
    when the command ``sends`` data to it; with ``retry_any`` (a push) every failure may
    pass later."""
    done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True)
    if done.returncode == 0:
        return
    # DVC exits 1 on its own refusals (a path outside the project, a missing folder,
    # overlapping outputs) and 255 on unexpected ones (a connection refused, a disk
    # error). A refusal is the same on every retry; the others, and a push, may pass later.
    locked = "Unable to acquire lock" in done.stderr
    retryable = retry_any or locked or done.returncode != 1
    where = f" to remote {_remote_url(remote, repo, env)}" if sends else ""
    raise VersionError(
        f"`dvc {' '.join(command[1:])}` failed{where}: {done.stderr.strip()}", retryable=retryable
    )


def version_store(
    store: Path = Path("data"),
    *,
    push: bool = True,
    repo: Path = Path("."),
    remote: str | None = None,
) -> str:
    """Snapshot ``store`` into its pointer (:func:`pointer`) and push it to ``remote``
    (default DVC's default remote); return the new content hash. A push that fails (the
    remote is unreachable) raises naming the remote's URL; for a store inside the
    repository the pointer then records a version the remote does not hold yet, and the
    next run pushes it. A store outside the repository can only be versioned to a remote
    (``push`` must be true)."""
    store, repo = Path(store), Path(repo)
    full = store if store.is_absolute() else repo / store
    if not full.is_dir():
        raise VersionError(f"nothing to version: {str(store)!r} is not a folder", retryable=False)
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    remote_args = ["-r", remote] if remote else []
    inside = _inside(store, repo)
    meta_file = repo / pointer(store, repo)
    if inside is not None:
        _run([_dvc(), "add", str(inside)], repo, env, remote=remote, sends=False)
        if push:
            _run(
                [_dvc(), "push", *remote_args, str(meta_file.relative_to(repo))],
                repo,
                env,
                remote=remote,
                sends=True,
                retry_any=True,
            )
    else:
        _version_outside(full.resolve(), meta_file, repo, env, remote_args, push=push)
    meta = yaml.safe_load(meta_file.read_text())
    return str(meta["outs"][0]["md5"])


def _version_outside(
    store: Path,
    meta_file: Path,
    repo: Path,
    env: dict[str, str],
    remote_args: list[str],
    *,
    push: bool,
) -> None:
    """``dvc add --to-remote``: the store's disk to the remote, the pointer in ``repo``."""
    if not push:
        raise VersionError(
            f"{store} is outside the repository {repo.resolve()}: it is versioned straight "
            "to a DVC remote, so it cannot be versioned without a push (drop --no-push)",
            retryable=False,
        )
    recorded = _recorded_source(meta_file)
    if recorded is not None and recorded != str(store):
        raise VersionError(
            f"{meta_file.relative_to(repo)} already versions the store {recorded}, not "
            f"{store}: two stores outside the repository need different folder names",
            retryable=False,
        )
    meta_file.parent.mkdir(parents=True, exist_ok=True)
    out = meta_file.with_suffix("").relative_to(repo)
    remote = remote_args[1] if remote_args else None
    command = [_dvc(), "add", str(store), "--to-remote", "--out", str(out), *remote_args]
    _run(command, repo, env, remote=remote, sends=True)
    if recorded is None:  # DVC keeps a pointer's `meta` when it adds again
        meta = yaml.safe_load(meta_file.read_text())
        meta["meta"] = {"source": str(store)}
        meta_file.write_text(yaml.safe_dump(meta, sort_keys=False))
    # A restored copy (`dvc pull`) lands at stores/<name>: never a file for git.
    ignore = meta_file.parent / ".gitignore"
    entry = f"/{out.name}"
    lines = ignore.read_text().splitlines() if ignore.is_file() else []
    if entry not in lines:
        ignore.write_text("\n".join([*lines, entry]) + "\n")
