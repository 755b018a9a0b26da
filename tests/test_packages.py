"""Every source folder of the product is a package (it has an ``__init__.py``), so the
import contracts (``lint-imports``, pyproject.toml) see every module: a folder without one
is invisible to them, and a cycle through it goes unnoticed."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("serving", "tasks", "registry", "flows", "specops", "benchmarks")


def folders_without_init(root: Path, package: str) -> list[str]:
    folders = sorted({path.parent for path in (root / package).rglob("*.py")})
    return [str(f.relative_to(root)) for f in folders if not (f / "__init__.py").is_file()]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_source_folder_is_a_package(package):
    missing = folders_without_init(ROOT, package)
    assert not missing, (
        f"source folders without __init__.py (lint-imports cannot see them): {missing}"
    )


def test_the_check_sees_a_folder_without_an_init(tmp_path):
    (tmp_path / "pkg" / "inner").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "module.py").write_text("")
    (tmp_path / "pkg" / "inner" / "module.py").write_text("")
    assert folders_without_init(tmp_path, "pkg") == ["pkg/inner"]
