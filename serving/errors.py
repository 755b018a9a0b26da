"""Errors that specops raises on purpose, each naming the bad value and what to do instead."""

from __future__ import annotations


class SpecOpsError(Exception):
    """Base class: an expected failure with a message meant for the user."""


class BadInputError(SpecOpsError, ValueError):
    """A request or option is invalid; raised before any model work starts."""


class ModelSourceError(SpecOpsError, RuntimeError):
    """A model could not be found, converted or loaded."""


class IncompatibleDraftError(SpecOpsError, ValueError):
    """A draft cannot propose for this target (different vocabulary or tokenizer)."""
