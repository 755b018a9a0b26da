"""Export a draft package to a backend's format (:mod:`serving.backends`).

An export is a folder with ``export.json`` — the backend, the drafter it came from and the
:class:`~serving.backends.base.Speculation` to run — plus, for model drafts, ``draft/``: a
self-contained causal-LM folder (``config.json``, ``model.safetensors``, the tokenizer) that
vLLM takes as its draft ``model``, mlx-lm loads as its ``draft_model`` and
transformers-neuronx compiles. A ``layers:N`` draft, which shares the target's modules
at serve time, is written out as a model of its own here, and so is a ``lora:PATH`` draft
(a package that stores its adapter only): its adapter is merged here into the target's
first N fp32 layers (:func:`serving.models.lora.load_lora_draft`), the merged weights
written only where a backend needs them.

A ``suffix`` draft becomes vLLM's ``suffix`` method (its corpus does not travel: vLLM's
suffix trees are built from the responses the server itself produces, so the export
records that under ``notes``), and a ``head`` in the ``eagle`` layout becomes an EAGLE-1
folder in ``draft/`` (:mod:`tasks.evaluate.eagle_export`).

What each backend can run is fixed by the backend (:data:`serving.backends.BACKENDS`);
a draft it cannot load fails here, before any model work, naming the drafter and the
backend. Exports are written into a temporary folder and renamed into place.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from serving.atomic import atomic_dir
from serving.backends import Speculation, UnsupportedDraftError, backend_info, check_supported
from serving.backends.exports import DRAFT_FOLDER, EXPORT_MANIFEST, load_export, read_export
from serving.engine.drafters.kinds import DrafterSpec, kind_of, split_spec
from serving.engine.drafters.package import read_manifest
from serving.errors import ModelSourceError
from serving.target import DEFAULT_TARGET
from tasks.train.distill_model import save_causal_lm

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def speculation_for(drafter: str, backend: str, k: int) -> Speculation:
    """The :class:`Speculation` a drafter spec becomes on ``backend``: its kind's
    :attr:`~serving.engine.drafters.kinds.DrafterKind.backend_method` (``draft_path`` is
    the export's ``draft/`` folder). Raises :class:`UnsupportedDraftError`."""
    backend_info(backend)
    kind = kind_of(drafter)
    method = kind.backend_method if kind is not None else None
    if method is None:
        raise UnsupportedDraftError(
            f"drafter {drafter!r} runs only on the specops engine (backend 'transformers' "
            f"through its own evaluation); backend {backend!r} loads prompt lookup (pld), "
            "model drafts (layers:N, model:PATH, lora:PATH), suffix decoding (suffix) and "
            "EAGLE heads (head:PATH) where the backend has them"
        )
    speculation = _speculation(method, k, split_spec(drafter)[1])
    check_supported(backend, speculation)
    return speculation


def _speculation(method: str, k: int, arg: str | None) -> Speculation:
    """The settings of a backend ``method`` drafting ``k`` tokens (``arg``: the spec's)."""
    if method == "ngram":  # prompt lookup: its longest n-gram is the spec's argument
        return Speculation("ngram", k, prompt_lookup_max=int(arg or 3))
    if method == "draft_model":
        return Speculation("draft_model", k, draft_path=DRAFT_FOLDER)
    if method == "eagle":
        return Speculation("eagle", k, draft_path=DRAFT_FOLDER)
    if method == "suffix":
        # specops's suffix drafter defaults: no cap on the draft per matched token (a factor
        # of k lets a one-token match draft k) and no confidence floor.
        return Speculation("suffix", k, suffix_max_spec_factor=float(k), suffix_min_token_prob=0.0)
    return Speculation()  # none: plain decoding


def target_folder(target: str) -> Path:
    """``smollm2`` (the shipped model, converted once) or a causal-LM folder."""
    if target == DEFAULT_TARGET:
        from serving.models.real import real_model_dir

        return real_model_dir()
    folder = Path(target)
    if not (folder / "config.json").is_file():
        raise ModelSourceError(
            f"target {target!r} is neither {DEFAULT_TARGET!r} nor a model folder"
        )
    return folder.resolve()


def _write_model_draft(spec: DrafterSpec, drafter: str, out: Path, target_source: str) -> None:
    """The model draft of ``spec`` (``drafter`` as the package states it, its paths
    resolved in ``spec``) written to ``out`` with the target's tokenizer (mlx-lm loads one
    with every model)."""
    from serving.hardware import engine_target
    from serving.loader import load_target

    target = load_target(target_source, engine_target("cpu-stock"))
    save_causal_lm(_model_draft(spec, drafter, target.model), out, target.tokenizer)


def _model_draft(spec: DrafterSpec, drafter: str, model: PreTrainedModel) -> PreTrainedModel:
    """The causal LM a model drafter (``layers:N``, ``lora:PATH``, ``model:PATH``) drafts
    with for the target ``model``."""
    from serving.models.truncated import first_layers

    assert spec.arg is not None  # every model kind takes an argument (checked)
    if spec.kind == "layers":
        return first_layers(model, int(spec.arg))
    if spec.kind == "lora":
        from serving.models.lora import load_lora_draft

        return load_lora_draft(spec.arg, model)  # merged here, against the target
    import torch
    from transformers import AutoModelForCausalLM

    folder = Path(spec.arg)
    try:
        draft = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    except (OSError, ValueError) as error:
        raise ModelSourceError(f"cannot load the model draft at {str(folder)!r}: {error}") from None
    if draft.config.vocab_size != model.config.vocab_size:
        raise UnsupportedDraftError(
            f"draft {drafter!r} has {draft.config.vocab_size} tokens, the target "
            f"{model.config.vocab_size}: it cannot draft for this target"
        )
    return draft


def export_draft(
    package: str | Path, backend: str, out: str | Path, *, k: int, target: str = DEFAULT_TARGET
) -> Path:
    """Export the draft package at ``package`` for ``backend`` into ``out`` (``target``:
    the target's source, :data:`~serving.target.DEFAULT_TARGET` or a model folder)."""
    package, out = Path(package), Path(out)
    manifest = read_manifest(package)
    speculation = speculation_for(manifest.drafter, backend, k)
    record = {
        "format": 1,
        "backend": backend,
        "drafter": manifest.drafter,
        "family": manifest.family,
        "speculation": speculation.to_dict(),
    }

    if speculation.method == "suffix":
        record["notes"] = [
            "vLLM's suffix method builds its trees from the requests and responses the server "
            "itself sees; the corpus of the specops suffix draft does not travel with it"
        ]
    with atomic_dir(out) as scratch:
        if speculation.method == "draft_model":
            spec = manifest.spec(package)
            _write_model_draft(spec, manifest.drafter, scratch / DRAFT_FOLDER, target)
        elif speculation.method == "eagle":
            from tasks.evaluate.eagle_export import write_eagle_draft

            head = Path(str(manifest.spec(package).arg))  # head:PATH, inside the package
            write_eagle_draft(head, target_folder(target), scratch / DRAFT_FOLDER)
        (scratch / EXPORT_MANIFEST).write_text(json.dumps(record, indent=2))
    return out


__all__ = ["export_draft", "load_export", "read_export", "speculation_for", "target_folder"]
