"""The names other packages import from ``tasks.loop.steps`` (``specops``, ``tasks/gpu``,
``benchmarks``, ``scripts``), where the loop's plain steps were all kept before they were
split by family: :mod:`tasks.loop.evaluation_steps` (:func:`decide`),
:mod:`tasks.loop.registry_steps` (:func:`builtin_package`), :mod:`tasks.loop.targets`
(:func:`target_for`), :mod:`tasks.loop.results` (:class:`Decision`). New code imports
those modules; this one goes once its importers do.
"""

from __future__ import annotations

from tasks.loop.evaluation_steps import decide
from tasks.loop.registry_steps import builtin_package
from tasks.loop.results import Decision
from tasks.loop.targets import target_for

__all__ = ["Decision", "builtin_package", "decide", "target_for"]
