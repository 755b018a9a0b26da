"""Drafter specs: the strings users type (``none``, ``pld``, ``ngram:4``, ``layers:4``,
``model:PATH``, ``head:PATH``) parsed into drafters. Parsing is split from building so that
a bad spec fails before any model is loaded. What each kind accepts and builds is declared
in :mod:`serving.engine.drafters.kinds`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from serving.engine.drafters.args import (
    NGRAM_FALLBACKS,
    NGRAM_HELP,
    NgramOptions,
    parse_ngram_options,
)
from serving.engine.drafters.base import Drafter
from serving.engine.drafters.kinds import (
    KIND_BY_NAME,
    KINDS,
    SPEC_HELP,
    DrafterSpec,
    kind_of,
    split_spec,
)
from serving.errors import BadInputError

if TYPE_CHECKING:
    from serving.target import LoadedTarget

__all__ = [
    "KINDS",
    "NGRAM_FALLBACKS",
    "NGRAM_HELP",
    "SPEC_HELP",
    "DrafterSpec",
    "NgramOptions",
    "build_drafter",
    "parse_drafter_spec",
    "parse_ngram_options",
]


def parse_drafter_spec(spec: str) -> DrafterSpec:
    """Check a drafter spec without loading anything."""
    if not isinstance(spec, str) or not spec.strip():
        raise BadInputError(f"empty drafter spec {spec!r}; use one of: {SPEC_HELP}")
    kind = kind_of(spec)
    if kind is None:
        raise BadInputError(f"unknown drafter {spec!r}; use one of: {SPEC_HELP}")
    _, arg = split_spec(spec)
    kind.check(spec, arg)
    return DrafterSpec(kind.name, arg)


def build_drafter(spec: str | DrafterSpec, target: LoadedTarget | None) -> Drafter | None:
    """Build the drafter for ``spec`` against ``target`` (``None`` for plain decoding). A
    lookup drafter reads nothing of the target and may be built without one (a draft
    client that loaded none); the others refuse ``None`` naming the spec."""
    parsed = parse_drafter_spec(spec) if isinstance(spec, str) else spec
    return KIND_BY_NAME[parsed.kind].build(parsed, target)
