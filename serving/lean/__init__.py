"""The lean decode step: fused C++ ops over a static KV cache on the CPU targets, a
fixed-shape pass captured as CUDA graphs on ``cuda`` (docs/lean.md)."""
