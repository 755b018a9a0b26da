"""How every ``specops`` command ends on bad input: one line naming what was wrong, exit 2."""

from __future__ import annotations

from typing import NoReturn

import typer


def fail(message: str) -> NoReturn:
    """Print one line naming what was wrong and exit 2 (no traceback)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)
