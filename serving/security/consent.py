"""A client's say over capture: the ``X-SpecOps-Capture`` header, read the same way by the
engine's server and the vLLM front (the body fields ``capture`` and OpenAI's ``store``
are read by each from its own parsed body)."""

from __future__ import annotations

from serving.errors import BadInputError

CAPTURE_HEADER = "X-SpecOps-Capture"
_VALUES = {"on": True, "yes": True, "true": True, "1": True} | {
    "off": False,
    "no": False,
    "false": False,
    "0": False,
}


def header_consent(value: str | None) -> bool | None:
    """What the header says: True (on), False (off), None (absent). A value outside
    on/off (yes/no, true/false, 1/0) is a :class:`BadInputError` naming it."""
    if value is None:
        return None
    said = _VALUES.get(value.strip().lower())
    if said is None:
        raise BadInputError(
            f"header {CAPTURE_HEADER}: {value!r} is not one of on/off (also yes/no, "
            "true/false, 1/0)"
        )
    return said
