"""Moved to ferry._native.dlpack (issue 37). Kept for torch/_data_parallel.py, which imports make_capsule
from here until its rewrite onto the native layer: remove this module then."""
from ._native.dlpack import make_capsule

__all__ = ["make_capsule"]
