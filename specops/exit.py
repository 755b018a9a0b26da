"""How every ``specops`` command ends on bad input: one line naming what was wrong, exit 2;
on a refusal by the registry (the input was well formed), exit 1."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import typer


def fail(message: str) -> NoReturn:
    """Print one line naming what was wrong and exit 2 (no traceback)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


def refuse(message: str) -> NoReturn:
    """Print a refusal on one line and exit 1 (the input was well formed)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=1)


@contextmanager
def failing(*, refusals: tuple[type[Exception], ...] = ()) -> Iterator[None]:
    """Inside, a :class:`~serving.errors.SpecOpsError` ends the command with one line: exit 1
    for one of ``refusals``, else exit 2 (:func:`fail`). Every command's ``try/except``."""
    from serving.errors import SpecOpsError

    try:
        yield
    except SpecOpsError as error:
        if isinstance(error, refusals):
            refuse(str(error))
        fail(str(error))
