"""Names for JSON documents the tasks pass through without reading them field by field.

Where a task knows a document's keys, it says so with a ``TypedDict`` next to the code
that writes it; this module names the rest: a loaded config, a model's ``model_dump``, an
arbitrary JSON object handed on as it came.
"""

from __future__ import annotations

from typing import Any, TypeAlias

# A JSON object whose fields the holder does not read one by one (a config handed on, a
# pydantic model's ``model_dump(mode="json")``, a results file read back whole).
JsonObject: TypeAlias = dict[str, Any]
