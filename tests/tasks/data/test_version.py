"""Versioning the store with DVC: pushed to the remote it is told (the team stack's SSH
remote is named ``team``), and a push that fails names that remote's URL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from serving.errors import SpecOpsError
from tasks.data.version import version_store

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
    with pytest.raises(SpecOpsError, match=r"remote team \(ssh://nobody@127.0.0.1:1/srv/dvc\)"):
        version_store(Path("data"), repo=repo, remote="team")
