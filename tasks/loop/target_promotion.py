"""Registered drafts on other hardware targets: export on promotion, evaluate there, and
move that target's champion alias only to a version evaluated there.

- :func:`export_for_targets`: after a promotion, the draft is exported to the format of
  every other backend that runs here and can load it; the registry keeps each export in
  the version's run (``exports/<backend>``).
- :func:`evaluate_registered`: the exported drafts through the target's backend
  (:func:`tasks.evaluate.targets.evaluate_target`), metrics logged to MLflow keyed by the target;
  the fastest exact draft that beats plain decoding there by the gates' margin (and the
  current champion, if one was evaluated alongside) becomes ``champion-<target>``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from registry.client import DraftVersion, Registry
from serving.backends import UnsupportedDraftError
from serving.engine.drafters.package import read_manifest
from serving.errors import ModelSourceError
from serving.hardware import HardwareTarget, load_hardware
from tasks.data.prompts import Prompt
from tasks.evaluate import gates
from tasks.evaluate.export import export_draft, speculation_for
from tasks.evaluate.priced import priced_backend_speedups
from tasks.evaluate.targets import (
    PromotionDecision,
    TargetReport,
    check_runnable,
    evaluate_target,
    metrics_of,
)
from tasks.loop.lineage import git_commit

log = logging.getLogger(__name__)


def ensure_export(
    registry: Registry,
    draft: DraftVersion,
    backend: str,
    cache: Path,
    *,
    k: int,
    target: str | None = None,
) -> Path:
    """The draft's export for ``backend``, from the registry or exported and logged now.
    ``target`` (default: the loop's, ``SPECOPS_TARGET``) gives a model draft its tokenizer
    and a LoRA adapter the layers it is merged into."""
    if f"export.{backend}" in registry.get(draft.family, draft.version).tags:
        return registry.download_export(draft, backend, cache)
    if target is None:
        from tasks.settings import loop_settings

        target = loop_settings().target
    package = registry.download(draft, cache)
    folder = export_draft(
        package,
        backend,
        cache / "exports" / draft.label.replace("/", "-") / backend,
        k=k,
        target=target,
    )
    registry.log_export(draft, backend, folder)
    return folder


def export_for_targets(registry: Registry, draft: DraftVersion, cache: Path) -> dict[str, str]:
    """Export ``draft`` for every other backend that runs here; ``backend -> outcome``."""
    outcomes: dict[str, str] = {}
    drafter = read_manifest(registry.download(draft, cache)).drafter
    for name, target in sorted(load_hardware().targets.items()):
        if target.backend == "transformers" or not target.runs_here:
            continue
        if target.backend in outcomes:
            continue
        try:
            speculation_for(drafter, target.backend, target.num_speculative_tokens)
        except UnsupportedDraftError as error:
            outcomes[target.backend] = f"not exported: {error}"
            continue
        try:
            ensure_export(registry, draft, target.backend, cache, k=target.num_speculative_tokens)
        except (UnsupportedDraftError, ModelSourceError) as error:
            # Found only once the draft's weights are read (a model draft of another
            # vocabulary, a LoRA adapter of another target, say). The promotion on the
            # engine's target has happened and stands; this backend just cannot serve it.
            outcomes[target.backend] = f"not exported: {error}"
            continue
        outcomes[target.backend] = f"exported (for {name})"
    return outcomes


def evaluate_registered(
    registry: Registry,
    hardware: HardwareTarget,
    drafts: Sequence[DraftVersion],
    prompts: Sequence[Prompt],
    *,
    cache: Path,
    workdir: Path,
    max_new_tokens: int = 64,
    promote: bool = True,
) -> TargetReport:
    """Evaluate registered drafts on ``hardware`` (refused unless it runs here), log it,
    and promote the winner there."""
    spec = check_runnable(hardware)
    exports = {
        d.label: ensure_export(registry, d, spec.backend, cache, k=spec.num_speculative_tokens)
        for d in drafts
    }
    report = evaluate_target(
        hardware, {}, prompts, workdir=workdir, exports=exports, max_new_tokens=max_new_tokens
    )
    plain = report["results"]["plain"]
    for draft in drafts:
        registry.log_evaluation(
            draft,
            hardware.name,
            metrics_of(report["results"][draft.label], plain),
            report={k: v for k, v in report.items() if k != "per_prompt"},
            params={"backend": spec.backend, "prompts": len(prompts)},
            tags={"git_commit": git_commit()},
        )
    report["decision"] = _decide(registry, hardware, drafts, report, promote=promote)
    return report


def _decide(
    registry: Registry,
    hardware: HardwareTarget,
    drafts: Sequence[DraftVersion],
    report: TargetReport,
    *,
    promote: bool,
) -> PromotionDecision:
    config = gates.load_gates()
    gain = config.min_speedup_gain
    results = report["results"]
    # The gates' speed: measured, or priced by their fixed profile.
    speedups: dict[str, float | None] = (
        {name: result["speedup"] for name, result in results.items()}
        if config.speed_profile is None
        else priced_backend_speedups(report, config.speed_profile.pricing(hardware.name))
    )
    champion = registry.champion(hardware.name)
    bar = 1.0 + gain
    if champion is not None and champion.label in results:
        bar = max(bar, (speedups[champion.label] or 0.0) * (1.0 + gain))
    candidates = [
        d
        for d in drafts
        if results[d.label]["exact"]
        and (speedups[d.label] or 0.0) >= bar
        and (champion is None or d.label != champion.label)
    ]
    if not candidates:
        return {
            "promoted": None,
            "reason": f"no exact draft reached {bar:.2f}x plain decoding on {hardware.name} "
            f"(champion: {champion.label if champion else 'none: plain decoding serves'})",
        }
    best = max(candidates, key=lambda d: speedups[d.label] or 0.0)
    reason = (
        f"{best.label}: {speedups[best.label] or 0.0:.2f}x plain on {hardware.name}, "
        f"exact; bar {bar:.2f}x"
    )
    if promote:
        registry.promote(
            best,
            hardware.name,
            reason=reason,
            metrics=metrics_of(results[best.label], results["plain"]),
        )
    return {"promoted": best.label if promote else None, "winner": best.label, "reason": reason}
