"""Drafters: each proposes up to k tokens and learns what the target kept.

A new drafter is one new module implementing :class:`serving.engine.drafters.base.Drafter` and
naming its ``kind``, declared once in :mod:`serving.engine.drafters.kinds`;
:func:`serving.engine.drafters.factory.build_drafter` maps a spec string to it.
"""
