"""Shared by the contract tests: the generator of the fixtures (scripts/
make_contract_fixtures.py: the one place where what varies between runs is normalised),
the fixtures folder, and the tiny world and packages rebuilt once per session by today's
code, to compare with what the fixtures recorded."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "contracts"
GENERATOR = ROOT / "scripts" / "make_contract_fixtures.py"


def _load_generator():
    """The generator as a module (scripts/ is no package); registered in sys.modules
    first, as its dataclasses need."""
    name = "make_contract_fixtures"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, GENERATOR)
    assert spec is not None and spec.loader is not None, GENERATOR
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def gen():
    return _load_generator()


@pytest.fixture(scope="session")
def fixtures() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def world(gen, tmp_path_factory):
    """The tiny target, its folder and teacher cache, built by today's code."""
    with gen.torch_threads(1):
        return gen.tiny_world(tmp_path_factory.mktemp("contracts-world"))


@pytest.fixture(scope="session")
def built(gen, world):
    """A package of every kind, written by today's writers (trained ones: a few steps)."""
    return gen.build_packages(world)
