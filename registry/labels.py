"""How people and files name a draft version: ``<family>/<version>`` or
``<registered model>/<version>``.

Its own module, free of the registry's settings and of MLflow, because an evaluation file
written on a machine without the MLOps stack checks its labels with it
(tasks/evaluate/evaluation_file.py, docs/targets.md).
"""

from __future__ import annotations

LABEL_PATTERN = r"^[A-Za-z0-9_.-]+/[1-9][0-9]*$"
