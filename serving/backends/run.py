"""Run an interleaved evaluation on one backend, inside that backend's environment.

``python -m serving.backends.run REQUEST.json REPORT.json`` — the main environment writes
the request (target folder, contenders as :class:`Speculation` dicts, tokenized prompts),
starts this module with the backend's interpreter (:mod:`tasks.evaluate.targets`) and reads the
report back. Per prompt, plain greedy decoding and every contender run once each, in an
order that rotates per prompt, after one warm-up generation each, so machine noise lands
on all alike. Each contender's output must equal the backend's own plain greedy output
token for token (``exact``). Progress goes to stderr.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from serving.atomic import write_json_atomic
from serving.backends import Speculation, open_backend
from serving.backends.base import BackendOutput
from serving.errors import BadInputError, SpecOpsError

REFERENCE = "plain"


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def summarize(outputs: list[BackendOutput], exact: list[bool], reference_tps: float | None):
    generated = sum(len(o.token_ids) for o in outputs)
    seconds = sum(o.seconds for o in outputs)
    checks = sum(o.checks for o in outputs)
    drafted = sum(o.draft_tokens for o in outputs)
    accepted = sum(o.accepted_tokens for o in outputs)
    longest = max((len(o.kept_by_position) for o in outputs), default=0)
    reached = [
        sum(o.reached_by_position[i] for o in outputs if i < len(o.reached_by_position))
        for i in range(longest)
    ]
    kept = [
        sum(o.kept_by_position[i] for o in outputs if i < len(o.kept_by_position))
        for i in range(longest)
    ]
    tps = _ratio(generated, seconds)
    return {
        "requests": len(outputs),
        "generated_tokens": generated,
        "seconds": seconds,
        "checks": checks,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance_rate": _ratio(accepted, drafted),
        "mean_accepted_length": _ratio(generated, checks),
        "acceptance_by_position": [_ratio(k, r) for k, r in zip(kept, reached, strict=True)],
        "tokens_per_s": tps,
        "speedup": tps / reference_tps if tps and reference_tps else None,
        "exact": all(exact),
        "mismatched_prompts": [i for i, ok in enumerate(exact) if not ok],
    }


def run(request: dict[str, Any], progress=sys.stderr) -> dict[str, Any]:
    backend = request["backend"]
    prompts = request["prompts"]
    if not prompts:
        raise BadInputError("no prompts to evaluate")
    max_new = int(request["max_new_tokens"])
    options = request.get("options", {})
    contenders = {REFERENCE: Speculation()}
    for name, raw in request["contenders"].items():
        if name == REFERENCE:
            raise BadInputError(f"a contender may not be called {REFERENCE!r}")
        contenders[name] = Speculation.from_dict(raw)
    engines = {}
    for name, speculation in contenders.items():
        print(f"[{backend}] loading {name}: {speculation.method}", file=progress, flush=True)
        engines[name] = open_backend(backend, request["target"], speculation, **options)
    for engine in engines.values():  # warm-up: first-call costs stay out of the timings
        engine.generate(prompts[0]["token_ids"], min(8, max_new))
    names = list(engines)
    rows: dict[str, list[BackendOutput]] = {name: [] for name in names}
    exact: dict[str, list[bool]] = {name: [] for name in names}
    for index, prompt in enumerate(prompts):
        order = names[index % len(names) :] + names[: index % len(names)]
        outputs = {name: engines[name].generate(prompt["token_ids"], max_new) for name in order}
        for name in names:
            rows[name].append(outputs[name])
            exact[name].append(outputs[name].token_ids == outputs[REFERENCE].token_ids)
        print(f"[{backend}] prompt {index + 1}/{len(prompts)}", file=progress, flush=True)
    reference = summarize(rows[REFERENCE], exact[REFERENCE], None)
    results = {
        name: summarize(rows[name], exact[name], reference["tokens_per_s"]) for name in names
    }
    for name in names:
        results[name]["mismatched_prompts"] = [
            prompts[i]["id"] for i in results[name]["mismatched_prompts"]
        ]
    for engine in engines.values():
        engine.close()
    return {
        "backend": backend,
        "target": request["target"],
        "options": options,
        "prompts": len(prompts),
        "max_new_tokens": max_new,
        "contenders": {name: s.to_dict() for name, s in contenders.items()},
        "results": results,
        "per_prompt": {
            name: [
                {
                    "prompt_id": p["id"],
                    **{k: v for k, v in o.to_dict().items() if k != "token_ids"},
                    "tokens": len(o.token_ids),
                }
                for p, o in zip(prompts, rows[name], strict=True)
            ]
            for name in names
        },
        "outputs": {name: [o.token_ids for o in rows[name]] for name in names},
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m serving.backends.run REQUEST.json REPORT.json", file=sys.stderr)
        return 2
    try:
        request = json.loads(Path(args[0]).read_text())
        report = run(request)
    except SpecOpsError as error:
        write_json_atomic(Path(args[1]), {"error": type(error).__name__, "message": str(error)})
        print(f"error: {error}", file=sys.stderr)
        return 1
    write_json_atomic(Path(args[1]), report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
