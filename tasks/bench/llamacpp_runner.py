"""The llama.cpp side of ``specops bench``: greedy decoding with llama-cpp-python, served
over JSON lines. Runs inside ``.venv-llamacpp`` (``scripts/setup_backend.sh llamacpp``),
never in the main environment: it imports only the standard library and ``llama_cpp``.

``python -m tasks.bench.llamacpp_runner --model GGUF --threads N --n-ctx N
[--prompt-lookup-tokens K ...]`` loads the GGUF once for plain decoding and once per prompt
lookup setting (``LlamaPromptLookupDecoding(num_pred_tokens=K)`` is fixed at load, and a
draft model forces ``logits_all``, which plain decoding must not pay for; the file is
memory-mapped, so the copies share its pages), then answers one line per request on
stdout::

    -> {"ready": true, "llama_cpp": "0.3.36", "threads": 2, "n_ctx": 1024, ...}
    <- {"prompt": [ids], "max_new_tokens": 128, "mode": "plain" | "prompt_lookup",
        "num_pred_tokens": 10, "eos": [ids]}
    -> {"token_ids": [ids], "seconds": 1.23, "stop": "eos" | "length"}
    -> {"error": "BadRequest", "message": "..."}      (the runner keeps serving)
    <- {"quit": true}  or end of input                    (the runner exits 0)

Generation is greedy (temperature 0, so llama.cpp's greedy sampler; top_k 1, no repeat
penalty) from the given token ids, which the bench made with its own tokenizer and chat
template, so every method decodes the same prompt. It stops at the budget or after an EOS
id, which is kept in ``token_ids`` as the specops engine and ``generate`` keep it, so
token counts compare. Each request starts from an empty KV cache (``reset`` before
``generate``: llama-cpp-python would otherwise reuse the previous request's matching
prefix), so requests and modes never share cache state. ``seconds`` covers the prefill and
every generated token, as the bench times the other methods. Failing to load prints one
``{"error": ...}`` line and exits 1; llama.cpp's own logs go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import IO, Any

MODES = ("plain", "prompt_lookup")


class BadRequest(Exception):
    """A request this runner cannot serve; the reply names the bad field."""


def _protocol_stream() -> IO[str]:
    """The real stdout, kept for the protocol; file descriptor 1 then points at stderr, so
    nothing a C library prints can corrupt a reply line."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    sys.stdout.flush()
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return protocol


def _reply(stream: IO[str], payload: dict[str, Any]) -> None:
    stream.write(json.dumps(payload) + "\n")
    stream.flush()


class Models:
    """One ``Llama`` for plain decoding and one per prompt-lookup setting."""

    def __init__(
        self, model_path: str, *, threads: int, n_ctx: int, prompt_lookup_tokens: list[int]
    ) -> None:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        def load(draft: Any = None) -> Any:
            return Llama(
                model_path=model_path,
                n_ctx=n_ctx,
                n_threads=threads,
                n_threads_batch=threads,
                logits_all=False,  # a draft model turns it on by itself (it needs every row)
                draft_model=draft,
                verbose=False,
            )

        self.n_ctx = n_ctx
        self.plain = load()
        self.prompt_lookup = {
            k: load(LlamaPromptLookupDecoding(num_pred_tokens=k))
            for k in sorted(set(prompt_lookup_tokens))
        }

    def pick(self, mode: str, num_pred_tokens: int | None) -> Any:
        if mode == "plain":
            return self.plain
        if mode != "prompt_lookup":
            raise BadRequest(f"unknown mode {mode!r}; choose one of {MODES}")
        if num_pred_tokens not in self.prompt_lookup:
            raise BadRequest(
                f"prompt lookup with num_pred_tokens={num_pred_tokens!r} was not loaded; "
                f"loaded: {sorted(self.prompt_lookup)} (start with --prompt-lookup-tokens)"
            )
        return self.prompt_lookup[num_pred_tokens]


def generate(models: Models, request: dict[str, Any]) -> dict[str, Any]:
    prompt = [int(t) for t in request.get("prompt") or []]
    budget = request.get("max_new_tokens")
    if not prompt:
        raise BadRequest("the prompt is empty; give at least one token id")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise BadRequest(f"max_new_tokens must be an integer >= 1, got {budget!r}")
    if len(prompt) + budget > models.n_ctx:
        raise BadRequest(
            f"prompt of {len(prompt)} tokens + max_new_tokens={budget} exceeds n_ctx="
            f"{models.n_ctx}; start the runner with a larger --n-ctx"
        )
    llm = models.pick(request.get("mode", "plain"), request.get("num_pred_tokens"))
    eos = {int(t) for t in request.get("eos") or []}
    output: list[int] = []
    stop = "length"
    started = time.perf_counter()
    llm.reset()  # n_tokens = 0: no prefix reuse, and the first eval clears every KV cell
    tokens = llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0)
    try:
        for token in tokens:
            output.append(int(token))
            if token in eos:
                stop = "eos"
                break
            if len(output) >= budget:
                break
    finally:
        tokens.close()
    seconds = time.perf_counter() - started
    return {"token_ids": output, "seconds": seconds, "stop": stop}


def serve(models: Models, requests: IO[str], replies: IO[str]) -> None:
    for line in requests:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise BadRequest(f"a request is a JSON object, got {line.strip()[:80]!r}")
            if request.get("quit"):
                return
            _reply(replies, generate(models, request))
        except (BadRequest, ValueError, TypeError) as error:
            _reply(replies, {"error": type(error).__name__, "message": str(error)})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="llama.cpp greedy decoding over JSON lines")
    parser.add_argument("--model", required=True, help="the GGUF file")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--n-ctx", type=int, default=4096)
    parser.add_argument("--prompt-lookup-tokens", type=int, action="append", default=[])
    args = parser.parse_args(argv)
    # OpenMP reads its thread count once, at load: set it before llama_cpp is imported.
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    replies = _protocol_stream()
    try:
        import llama_cpp

        if not os.path.isfile(args.model):
            raise FileNotFoundError(f"no GGUF file at {args.model!r}")
        models = Models(
            args.model,
            threads=args.threads,
            n_ctx=args.n_ctx,
            prompt_lookup_tokens=args.prompt_lookup_tokens,
        )
    except Exception as error:  # reported to the bench, which shows it with this stderr
        _reply(replies, {"error": type(error).__name__, "message": str(error)})
        return 1
    _reply(
        replies,
        {
            "ready": True,
            "llama_cpp": llama_cpp.__version__,
            "model": args.model,
            "threads": args.threads,
            "n_ctx": args.n_ctx,
            "prompt_lookup_tokens": sorted(models.prompt_lookup),
            "system_info": llama_cpp.llama_print_system_info().decode(errors="replace"),
        },
    )
    serve(models, sys.stdin, replies)
    return 0


if __name__ == "__main__":
    sys.exit(main())
