"""How every study's ``main`` ends: on bad input (a :class:`SpecOpsError`: a bad setting, a
missing file), one line naming what was wrong and exit status 2, as ``specops`` commands
end; a traceback only for a real failure."""

from __future__ import annotations

import sys
from collections.abc import Callable

from serving.errors import SpecOpsError


def run_study(study: Callable[[], object]) -> int:
    """Run ``study``; 0 when it finished, 2 (and ``error: ...`` on stderr) on bad input."""
    try:
        study()
    except SpecOpsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
