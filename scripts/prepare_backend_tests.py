"""Prepare what the backend tests load, in the main environment (torch lives here).

    .venv/bin/python scripts/prepare_backend_tests.py OUT

writes into OUT (reused when already complete):

- ``tiny/``: a tiny random Llama (2 layers, head size 64) with the real tokenizer;
- ``real/``: a link to the shipped SmolLM2-135M-Instruct, converted once;
- ``exports/<model>/<backend>/<draft>/``: drafts exported by :mod:`tasks.evaluate.export` exactly
  as a promotion exports them — ``layers1``/``layers4`` (the target's first layers) and
  ``self`` (a model draft that is the target itself, so every draft is accepted);
- ``prompts.json``: held-out HumanEval and ShareGPT prompts, tokenized.

The backend environments have no torch (MLX) or other pins (vLLM), so they only load
these folders: the same split as between promotion (here) and serving (there).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

BACKENDS = ("vllm", "mlx")


def main(out: Path) -> None:
    from serving.drafters.package import DraftManifest, write_package
    from serving.models.real import real_model_dir
    from serving.models.tiny import tiny_llama
    from tasks.data.traffic import build_workload
    from tasks.evaluate.export import export_draft
    from tasks.evaluate.targets import tokenize

    done = out / "ready.json"
    if done.is_file():
        print(f"backend test fixtures ready in {out}")
        return
    out.mkdir(parents=True, exist_ok=True)
    real = real_model_dir()
    tiny = out / "tiny"
    from transformers import AutoTokenizer

    model = tiny_llama(
        vocab_size=49152,
        hidden_size=128,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=256,
        max_positions=2048,
    )
    model.save_pretrained(tiny, safe_serialization=True)
    AutoTokenizer.from_pretrained(real).save_pretrained(tiny)
    link = out / "real"
    if not link.exists():
        link.symlink_to(real, target_is_directory=True)
    with tempfile.TemporaryDirectory() as scratch:
        packages = {
            "layers1": write_package(Path(scratch) / "l1", DraftManifest(drafter="layers:1")),
            "layers4": write_package(Path(scratch) / "l4", DraftManifest(drafter="layers:4")),
        }
        for name, folder in (("tiny", tiny), ("real", real)):
            packages["self"] = write_package(
                Path(scratch) / f"self-{name}",
                DraftManifest(drafter="model:weights"),
                {"weights": folder},
            )
            for backend in BACKENDS:
                for draft in ("layers1", "self") if name == "tiny" else ("layers4", "self"):
                    export_draft(
                        packages[draft],
                        backend,
                        out / "exports" / name / backend / draft,
                        k=3,
                        target=str(folder),
                    )
    prompts = build_workload("humaneval", 2, seed=0) + build_workload("sharegpt", 1, seed=0)
    (out / "prompts.json").write_text(json.dumps(tokenize(prompts, real)))
    done.write_text(json.dumps({"real": str(real)}))
    print(f"backend test fixtures written to {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/prepare_backend_tests.py OUT")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main(Path(sys.argv[1]))
