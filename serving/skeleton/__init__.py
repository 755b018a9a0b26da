"""Skeleton-of-thought building blocks: the skeleton grammar, its token constraint, the
parser, and the chat messages of the skeleton and its branches (docs/skeleton.md)."""
