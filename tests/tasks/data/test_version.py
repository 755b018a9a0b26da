"""Versioning the store with DVC: pushed to the remote it is told (the team stack's SSH
remote is named ``team``), and a push that fails names that remote's URL; a store outside
the repository is versioned straight to the remote, its pointer in the repository."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from serving.errors import SpecOpsError
from tasks.data.version import VersionError, pointer, version_store

pytestmark = pytest.mark.slow  # DVC processes pushing to remotes

DVC = str(Path(sys.executable).with_name("dvc"))


@pytest.fixture
def repo(tmp_path):
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([DVC, "init", "-q"], cwd=tmp_path, check=True, env=env)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "part.jsonl").write_text('{"id": 1}\n')
    return tmp_path


def _add_remote(repo: Path, name: str, url: str) -> None:
    subprocess.run([DVC, "remote", "add", "--local", name, url], cwd=repo, check=True)


def test_the_store_goes_to_the_named_remote(repo, tmp_path_factory):
    team = tmp_path_factory.mktemp("team-remote")
    default = tmp_path_factory.mktemp("default-remote")
    _add_remote(repo, "team", str(team))
    subprocess.run([DVC, "remote", "add", "-d", "local", str(default)], cwd=repo, check=True)
    digest = version_store(Path("data"), repo=repo, remote="team")
    assert digest.endswith(".dir") and (repo / "data.dvc").is_file()
    assert any(team.rglob("*")) and not any(default.rglob("*"))


def test_an_unreachable_remote_is_named_with_its_url(repo):
    # Nothing listens on port 1: the SSH connection is refused.
    _add_remote(repo, "team", "ssh://nobody@127.0.0.1:1/srv/dvc")
    with pytest.raises(
        SpecOpsError, match=r"remote team \(ssh://nobody@127.0.0.1:1/srv/dvc\)"
    ) as unreachable:
        version_store(Path("data"), repo=repo, remote="team")
    assert isinstance(unreachable.value, VersionError) and unreachable.value.retryable


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def _dvc(repo: Path, *args: str) -> None:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    subprocess.run([DVC, *args], cwd=repo, check=True, capture_output=True, env=env)


def test_a_store_outside_the_repository_is_versioned_and_restored(repo, tmp_path_factory):
    """The store on its own disk: its pointer is in the repository, its data goes straight
    to the remote; `git checkout` of a commit and `dvc pull` restore that version."""
    remote = tmp_path_factory.mktemp("remote")
    _dvc(repo, "remote", "add", "--local", "-d", "local", str(remote))  # kept across checkouts
    outside = tmp_path_factory.mktemp("raid") / "store"
    outside.mkdir()
    (outside / "part-1.jsonl").write_text('{"id": 1}\n')
    first = version_store(outside, repo=repo)
    meta_file = repo / "stores" / "store.dvc"
    assert yaml.safe_load(meta_file.read_text())["meta"] == {"source": str(outside.resolve())}
    assert pointer(outside, repo) == Path("stores/store.dvc")
    assert not any((repo / ".dvc" / "cache").rglob("*.dir"))  # nothing cached in the checkout
    assert (repo / "stores" / ".gitignore").read_text() == "/store\n"
    _git(repo, "add", "stores")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "v1")

    (outside / "part-2.jsonl").write_text('{"id": 2}\n')
    second = version_store(outside, repo=repo)
    assert second != first and first.endswith(".dir")
    assert yaml.safe_load(meta_file.read_text())["meta"] == {"source": str(outside.resolve())}
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "v2")

    _git(repo, "checkout", "-q", "HEAD~1")
    _dvc(repo, "pull", "stores/store.dvc")
    assert sorted(p.name for p in (repo / "stores" / "store").iterdir()) == ["part-1.jsonl"]
    status = subprocess.run(["git", "status", "--porcelain", "stores"], cwd=repo,
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert status == ""  # the restored copy is ignored


def test_an_outside_store_is_refused_without_a_push_or_under_another_stores_pointer(
    repo, tmp_path_factory
):
    remote = tmp_path_factory.mktemp("remote")
    _dvc(repo, "remote", "add", "-d", "local", str(remote))
    one, other = (tmp_path_factory.mktemp(name) / "store" for name in ("one", "other"))
    for folder in (one, other):
        folder.mkdir()
        (folder / "part.jsonl").write_text(f'{{"from": "{folder}"}}\n')
    with pytest.raises(VersionError, match="drop --no-push") as refused:
        version_store(one, repo=repo, push=False)
    assert not refused.value.retryable
    version_store(one, repo=repo)
    with pytest.raises(VersionError, match=f"already versions the store {one}") as refused:
        version_store(other, repo=repo)
    assert not refused.value.retryable


def test_a_refusal_of_dvc_is_not_retryable(repo):
    # A stage output overlapping the store is DVC's own refusal (exit 1): the same each time.
    (repo / "dvc.yaml").write_text("stages:\n  make:\n    cmd: echo\n    outs: [data]\n")
    with pytest.raises(VersionError, match="overlaps with an output of stage") as refused:
        version_store(Path("data"), repo=repo, push=False)
    assert not refused.value.retryable
