"""Finished studies, outside the installed product: each answered a question once (which
grammar library drives the skeleton, whether a traffic-trained suffix corpus beats prompt
lookup, the cascade's λ against quality, which trainable draft design pays, the head's
settings, what QLoRA costs on the CPU, what a LoRA package weighs, what a storm of
refusals costs the decoding), and its answer is kept in a page of ``docs/`` with the
command that reproduces it (the results files it quotes in ``measurements/``). They stay
runnable from the repository root:

    python -m benchmarks.constraint_compare   docs/skeleton.md
    python -m benchmarks.suffix_eval          docs/training.md
    python -m benchmarks.cascade_sweep        docs/cascade.md
    python -m benchmarks.draft_curves         docs/learning-curves.md
    python -m benchmarks.head_sweep           docs/learning-curves.md
    python -m benchmarks.qlora_cpu_speed      docs/training.md
    python -m benchmarks.lora_package_size    docs/training.md
    python -m benchmarks.overload             docs/security.md

May import the product (``specops``, ``flows``, ``tasks``, ``registry``, ``serving``);
nothing imports it (pyproject.toml's import contracts), and it is not installed
(``[tool.setuptools.packages.find]``). Its settings are in ``benchmarks/configs/``.
"""
