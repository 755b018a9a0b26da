"""The training stage: teacher data (the target's answers and its teacher-forced features),
the trainers (EAGLE-style head, LoRA / full distillation) on one shared training loop,
the head's reduced vocabulary, and the suffix index rebuilt from collected traffic.

May import: ``serving``, ``tasks.data``.
"""
