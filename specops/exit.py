"""How every ``specops`` command ends on bad input: one line naming what was wrong, exit 2;
on a refusal by the registry (the input was well formed), exit 1."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, NoReturn

import typer

if TYPE_CHECKING:
    from pydantic import ValidationError


def fail(message: str) -> NoReturn:
    """Print one line naming what was wrong and exit 2 (no traceback)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


def refuse(message: str) -> NoReturn:
    """Print a refusal on one line and exit 1 (the input was well formed)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=1)


def settings_message(error: ValidationError) -> str:
    """One line naming each bad setting of a pydantic ``ValidationError``."""
    parts = [
        f"{'.'.join(str(part) for part in item['loc']) or 'settings'}: {item['msg']}"
        for item in error.errors()
    ]
    return "bad settings: " + "; ".join(parts)


@contextmanager
def failing(
    *, refusals: tuple[type[Exception], ...] = (), settings: bool = False
) -> Iterator[None]:
    """Inside, a :class:`~serving.errors.SpecOpsError` ends the command with one line: exit 1
    for one of ``refusals``, else exit 2 (:func:`fail`); with ``settings``, so does a
    pydantic ``ValidationError`` of the settings built inside (each bad key named)."""
    from pydantic import ValidationError

    from serving.errors import SpecOpsError

    try:
        yield
    except SpecOpsError as error:
        if isinstance(error, refusals):
            refuse(str(error))
        fail(str(error))
    except ValidationError as error:
        if not settings:
            raise
        fail(settings_message(error))
