"""Run a prepared evaluation bundle on this machine and write an evaluation file.

For a machine that has only torch, transformers, peft and accelerate, plus the small wheels
listed in :data:`REMOTE_PACKAGES` (the GPU run kit brings them): no MLflow, Prefect, DVC,
Great Expectations or registry settings are imported on this path, nor by ``specops
profile`` (tests/tasks/evaluate/test_remote_closure.py runs both in a fresh virtual
environment holding only the lock's lines for those packages' dependency closure, the
repository on ``PYTHONPATH``). The bundle comes from
:func:`tasks.loop.remote_bundle.prepare_bundle`; the file goes back to ``specops registry
log-evaluation FILE --promote``.

    python -m tasks.evaluate.remote BUNDLE --target MODEL_DIR --out evaluation.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

from serving.errors import BadInputError, SpecOpsError
from serving.target import DEFAULT_TARGET

BUNDLE_FORMAT = 1
# What this path and `specops profile` may import, with what those depend on: the
# machine's own torch, transformers, peft and accelerate (never carried), and the small
# wheels a kit brings where they are missing: pyyaml (the configs), pydantic (the
# evaluation file and the configs), typer (the CLI), gguf (converting the shipped GGUF).
REMOTE_PACKAGES = (
    "torch",
    "transformers",
    "peft",
    "accelerate",
    "pyyaml",
    "pydantic",
    "typer",
    "gguf",
)


def read_bundle(bundle: Path) -> tuple[dict[str, Any], list[Any]]:
    """The request and the prompts of ``bundle``, checked."""
    from tasks.evaluate.evaluate import EncodedPrompt

    bundle = Path(bundle)
    try:
        request = json.loads((bundle / "request.json").read_text())
        rows = json.loads((bundle / "prompts.json").read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise BadInputError(f"{bundle} is not a readable evaluation bundle: {error}") from None
    found = request.get("format") if isinstance(request, dict) else None
    if found != BUNDLE_FORMAT:
        raise BadInputError(
            f"{bundle}/request.json has format {found!r}; this code reads format {BUNDLE_FORMAT}"
        )
    contenders = request.get("contenders")
    if not isinstance(contenders, dict) or not contenders:
        raise BadInputError(f"{bundle}/request.json names no contenders")
    for name in contenders:
        if not (bundle / "packages" / name / "draft.json").is_file():
            raise BadInputError(f"{bundle} lacks the draft package of contender {name!r}")
    prompts = []
    for index, row in enumerate(rows if isinstance(rows, list) else []):
        ids = row.get("token_ids") if isinstance(row, dict) else None
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
            raise BadInputError(f"{bundle}/prompts.json entry {index} has no token ids")
        prompts.append(EncodedPrompt(str(row["id"]), str(row["workload"]), ids))
    if not prompts:
        raise BadInputError(f"{bundle}/prompts.json holds no prompts")
    return request, prompts


def run_bundle(
    bundle: Path, *, target: str = DEFAULT_TARGET, threads: int | None = None, progress: bool = True
) -> dict[str, Any]:
    """Evaluate the bundle's contenders on its prompts on the hardware target it names,
    ``target`` (a model source: :data:`~serving.target.DEFAULT_TARGET` or a model folder)
    loaded on that target's device and kernels; return the evaluation file's content."""
    import torch
    import transformers

    from serving.hardware import engine_target
    from serving.loader import load_target, set_threads
    from tasks.evaluate.evaluate import Contender, evaluate

    request, prompts = read_bundle(bundle)
    hardware = str(request["hardware"])
    spec = engine_target(hardware)  # its verify curve must have been measured
    set_threads(threads or spec.threads)
    started = time.time()
    loaded = load_target(target, spec)
    contenders = [
        Contender(name, Path(bundle) / "packages" / name) for name in request["contenders"]
    ]
    report = evaluate(
        contenders,
        prompts,
        target=loaded,
        max_new_tokens=int(request["max_new_tokens"]),
        progress=progress,
    )
    return {
        "format": 1,
        "hardware": hardware,
        "contenders": dict(request["contenders"]),
        "prompts": len(prompts),
        "max_new_tokens": int(request["max_new_tokens"]),
        "produced_by": {
            "host": platform.node(),
            "device": spec.device
            + (f" ({torch.cuda.get_device_name()})" if spec.device.startswith("cuda") else ""),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
            "started": str(started),
            "finished": str(time.time()),
        },
        "report": report,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="the evaluation file to write")
    parser.add_argument(
        "--target", default=DEFAULT_TARGET, help=f"{DEFAULT_TARGET} or a local model folder"
    )
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    from tasks.evaluate.evaluation_file import write_evaluation_file

    try:
        evaluation = run_bundle(args.bundle, target=args.target, threads=args.threads)
        write_evaluation_file(args.out, evaluation)
    except SpecOpsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"evaluation written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
