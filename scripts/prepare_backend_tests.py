"""Prepare what the backend tests load, in the main environment (torch lives here).

    .venv/bin/python scripts/prepare_backend_tests.py OUT

writes into OUT (reused when already complete):

- ``tiny/``: a tiny random Llama (2 layers, head size 64) with the real tokenizer;
- ``real/``: a link to the shipped SmolLM2-135M-Instruct, converted once;
- ``exports/<model>/<backend>/<draft>/``: drafts exported by :mod:`tasks.evaluate.export` exactly
  as a promotion exports them — ``layers1``/``layers4`` (the target's first layers) and
  ``self`` (a model draft that is the target itself, so every draft is accepted);
- ``prompts.json``: held-out HumanEval and ShareGPT prompts, tokenized;
- ``exports/<model>/vllm/suffix/`` (vLLM's suffix method) and ``exports/<model>/vllm/eagle/``:
  an EAGLE-layout head trained briefly on the model's own answers (10 s tiny, 90 s real),
  exported as vLLM's EAGLE-1 draft, beside ``eagle-engine.json``: what the specops engine
  accepted with that head (k = 3) on ``prompts.json`` (48 tokens each), which vLLM must
  reproduce (made again, without retraining, when that length changes).

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
    from serving.engine.drafters.package import DraftManifest, write_package
    from serving.models.real import real_model_dir
    from serving.models.tiny import tiny_llama
    from tasks.data.traffic import build_workload
    from tasks.evaluate.export import export_draft
    from tasks.evaluate.targets import tokenize

    done = out / "ready.json"
    if done.is_file():
        eagle_fixtures(out)
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
    eagle_fixtures(out)
    print(f"backend test fixtures written to {out}")


EAGLE_TRAINING = {"tiny": (8, 10.0), "real": (16, 90.0)}  # teacher prompts, training seconds
# The tokens per prompt of tests/backends/test_vllm.py's one evaluation per model: every
# contender runs with the EAGLE export, so the engine's reference has that length too.
EAGLE_NEW_TOKENS = 48


def eagle_fixtures(out: Path) -> None:
    """The suffix export and a briefly trained EAGLE-layout head per model (see above),
    made once; the engine's reference run with each head, made again when
    ``EAGLE_NEW_TOKENS`` changes (seconds, where training takes minutes)."""
    marker = out / "eagle-ready.json"
    if not marker.is_file():
        for name, (teacher_prompts, seconds) in EAGLE_TRAINING.items():
            _train_eagle(out, name, teacher_prompts, seconds)
        marker.write_text("{}")
    for name in EAGLE_TRAINING:
        reference = out / "exports" / name / "vllm" / "eagle-engine.json"
        made = json.loads(reference.read_text()) if reference.is_file() else {}
        if made.get("max_new_tokens") != EAGLE_NEW_TOKENS:
            _engine_reference(out, name, reference)


def _train_eagle(out: Path, name: str, teacher_prompts: int, seconds: float) -> None:
    from serving.engine.drafters.package import DraftManifest, write_package
    from serving.hardware import engine_target
    from serving.loader import load_target
    from tasks.evaluate.export import export_draft
    from tasks.train.teacher import TeacherConfig
    from tasks.train.teacher_build import build_teacher_cache, sharegpt_teacher_prompts
    from tasks.train.train_head import TrainHeadConfig, train_head, write_head_package

    folder = (out / name).resolve()
    exports = out / "exports" / name / "vllm"
    with tempfile.TemporaryDirectory() as scratch:
        suffix = write_package(Path(scratch) / "suffix", DraftManifest(drafter="suffix"))
        export_draft(suffix, "vllm", exports / "suffix", k=3, target=str(folder))
    target = load_target(str(folder), engine_target("cpu-stock"))
    teacher = out / "heads" / name / "teacher"
    build_teacher_cache(
        target.model,
        sharegpt_teacher_prompts(target.tokenizer, teacher_prompts, max_prompt_tokens=192),
        teacher,
        eos_token_ids=list(target.eos_token_ids),
        config=TeacherConfig(max_new_tokens=48),
    )
    config = TrainHeadConfig(
        teacher_dir=teacher,
        output_dir=out / "heads" / name / "work",
        layout="eagle",
        intermediate_size=384,
        max_steps=10**9,
        batch_size=4,
        max_seq_len=256,
        learning_rate=1e-3,
        eval_every=10**6,
        checkpoint_every=10**6,
    )
    result = train_head(config, target.model, max_train_seconds=seconds)
    package = write_head_package(result, config, out / "heads" / name / "package", k=3)
    export_draft(package, "vllm", exports / "eagle", k=3, target=str(folder))


def _engine_reference(out: Path, name: str, reference: Path) -> None:
    """What the specops engine drafts and accepts with the head on ``prompts.json``."""
    from serving.engine.build import build_decoder
    from serving.engine.drafters.plan import DraftPlan
    from serving.engine.metrics import position_counts
    from serving.hardware import engine_target
    from serving.loader import load_target

    target = load_target(str((out / name).resolve()), engine_target("cpu-stock"))
    head = out / "heads" / name / "package" / "head"
    decoder = build_decoder(target, DraftPlan.parse(f"head:{head}", policy="fixed", k=3))
    runs = []
    for prompt in json.loads((out / "prompts.json").read_text()):
        generated = decoder.generate(prompt["token_ids"], max_new_tokens=EAGLE_NEW_TOKENS)
        _, kept = position_counts(generated.steps)
        runs.append({
            "token_ids": generated.token_ids,
            "draft_tokens": generated.stats.draft_tokens,
            "accepted_tokens": generated.stats.accepted_tokens,
            "kept_by_position": kept,
        })  # fmt: skip
    reference.write_text(json.dumps({"max_new_tokens": EAGLE_NEW_TOKENS, "k": 3, "prompts": runs}))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/prepare_backend_tests.py OUT")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main(Path(sys.argv[1]))
