"""The defaults every layer shares, declared once and importing nothing (so a command's
help, a settings class or a flow's parameters can name them without loading torch).

The modules that own each concept re-export them: :mod:`serving.target`
(``DEFAULT_TARGET``), :mod:`serving.hardware` (``DEFAULT_HARDWARE``) and
:mod:`serving.engine.drafters.plan` (``DEFAULT_POLICY``, ``DEFAULT_K``,
``DEFAULT_CASCADE_K``).
"""

from __future__ import annotations

from typing import Final, Literal

# The target a command, a server or a flow loads when none is named: the shipped
# SmolLM2-135M-Instruct (serving.models.real).
DEFAULT_TARGET: Final = "smollm2"
# The hardware target (configs/hardware.yaml) a command, a server or a flow runs on.
DEFAULT_HARDWARE: Final = "cpu"
# A draft plan's draft-length policy and largest draft when none is named (a package's
# draft.json without them, a champion, a per-request drafter).
DEFAULT_POLICY: Final[Literal["cost"]] = "cost"
DEFAULT_K: Final = 10
# A cascade's largest block when none is named.
DEFAULT_CASCADE_K: Final = 8
