"""Drafters: each proposes up to k tokens and learns what the target kept.

A new drafter is one new module implementing :class:`serving.drafters.base.Drafter` and
naming its ``kind``, declared once in :mod:`serving.drafters.kinds`;
:func:`serving.drafters.factory.build_drafter` maps a spec string to it.
"""
