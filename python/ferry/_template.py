"""A sample's or a batch's structure as a template: its tuples, lists, dicts and namedtuples, each leaf (a
tensor, an array, a number) replaced by a Slot naming its place in a list of values; fill() rebuilds the
structure around new values. Framework-neutral: ferry.torch's Prefetcher and Loader both make batches so.
"""
from __future__ import annotations

from typing import Any, List


class Slot:
    """The place of leaf `index` in a template."""
    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


def fill(template: Any, values: List[Any]) -> Any:
    """`template` with each Slot replaced by values[slot.index], its containers made again of their types."""
    if isinstance(template, Slot):
        return values[template.index]
    if isinstance(template, dict):
        return type(template)((k, fill(v, values)) for k, v in template.items())
    if isinstance(template, tuple) and hasattr(template, "_fields"):
        return type(template)(*(fill(v, values) for v in template))
    if isinstance(template, (tuple, list)):
        return type(template)(fill(v, values) for v in template)
    return template
