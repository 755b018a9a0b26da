"""The arguments of drafter specs (after ``KIND:``): numbers, paths and n-gram options,
checked with an error that names the spec and the bad part. No model code is imported here,
so a spec is checked before anything loads (:mod:`serving.engine.drafters.kinds`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from serving.errors import BadInputError


def int_arg(spec: str, arg: str | None, default: int | None, low: int) -> int:
    """The spec's integer argument (``default`` when absent; None: it is required)."""
    if arg is None:
        if default is None:
            raise BadInputError(f"drafter {spec!r} needs a number, e.g. {spec}:4")
        return default
    try:
        value = int(arg)
    except ValueError:
        raise BadInputError(f"drafter {spec!r}: {arg!r} is not an integer") from None
    if value < low:
        raise BadInputError(f"drafter {spec!r}: the number must be >= {low}, got {value}")
    return value


def folder_arg(spec: str, arg: str | None, what: str, usage: str) -> str:
    """The spec's required folder argument (``what``: "a model folder", ...)."""
    if not arg:
        raise BadInputError(f"drafter {spec!r} needs a path: {usage}")
    if not Path(arg).is_dir():
        raise BadInputError(f"drafter {spec!r}: {arg!r} is not {what}")
    return arg


NGRAM_FALLBACKS = ("stop", "shared", "target")
NGRAM_HELP = (
    "ngram[:N][,fallback=stop|shared|target][,min_conf=X][,store=PATH]: N >= 2 (default 4); "
    "fallback when the request's own n-grams know no continuation: stop drafting (default), "
    "a shared store built from a corpus file (store=PATH, needs fallback=shared), or the "
    "target's own guesses from its last pass (target); min_conf in [0, 1] stops a draft at "
    "a less frequent continuation"
)


@dataclass(frozen=True)
class NgramOptions:
    """The options of an ``ngram`` spec (its argument after ``ngram:``)."""

    n: int = 4
    fallback: str = "stop"
    min_conf: float = 0.0
    store: str | None = None

    def arg(self) -> str | None:
        """The spec argument that parses back to these options (None: all defaults)."""
        extras = []
        if self.fallback != "stop":
            extras.append(f"fallback={self.fallback}")
        if self.min_conf:
            extras.append(f"min_conf={self.min_conf:g}")
        if self.store is not None:
            extras.append(f"store={self.store}")
        if self.n == 4 and not extras:
            return None
        return ",".join([str(self.n), *extras])


def parse_ngram_options(spec: str, arg: str | None) -> NgramOptions:
    """The options of ``ngram[:ARG]``; :class:`BadInputError` naming the bad part."""
    if not arg:
        return NgramOptions()
    first, *rest = [part.strip() for part in arg.split(",")]
    n = 4
    if "=" not in first:
        n = int_arg(spec, first, 4, 2)
    else:
        rest = [first, *rest]
    values: dict[str, str] = {}
    for part in rest:
        key, eq, value = part.partition("=")
        key = key.strip().lower()
        if not eq or key not in ("fallback", "min_conf", "store") or not value.strip():
            raise BadInputError(f"drafter {spec!r}: {part!r} is not an n-gram option; {NGRAM_HELP}")
        if key in values:
            raise BadInputError(f"drafter {spec!r}: {key} is given twice")
        values[key] = value.strip()
    fallback = values.get("fallback", "stop").lower()
    if fallback not in NGRAM_FALLBACKS:
        raise BadInputError(
            f"drafter {spec!r}: fallback={fallback!r} is not one of {', '.join(NGRAM_FALLBACKS)}"
        )
    try:
        min_conf = float(values.get("min_conf", "0"))
    except ValueError:
        raise BadInputError(
            f"drafter {spec!r}: min_conf={values['min_conf']!r} is not a number"
        ) from None
    if not 0.0 <= min_conf <= 1.0:
        raise BadInputError(f"drafter {spec!r}: min_conf={min_conf:g} is not in [0, 1]")
    store = values.get("store")
    if (fallback == "shared") != (store is not None):
        raise BadInputError(
            f"drafter {spec!r}: fallback=shared and store=PATH go together (the shared store "
            "is built from the corpus file at PATH)"
        )
    if store is not None and not Path(store).is_file():
        raise BadInputError(f"drafter {spec!r}: store={store!r} is not a corpus file")
    return NgramOptions(n, fallback, min_conf, store)
