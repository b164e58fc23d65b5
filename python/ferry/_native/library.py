"""The library's own calls (version, checksum) and the one reader of the JSON it returns."""
from __future__ import annotations

import ctypes
import json
from ctypes import byref, c_void_p
from typing import Any, Callable

from .._c import lib, library_path, take_string

__all__ = ["version", "library_path", "checksum_of", "out_json"]


def version() -> str:
    """The loaded library's version, with the commit it was built from as a local label."""
    return lib.ferry_version().decode()


def out_json(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args, char** out) for a library function that returns JSON: the value, parsed, the string freed."""
    out = c_void_p()
    fn(*args, byref(out))
    return json.loads(take_string(out))


def checksum_of(data: Any) -> int:
    """ferry's 64-bit checksum of `data` (bytes, or anything with the buffer protocol) as one whole output."""
    view = memoryview(data).cast("B")
    n = view.nbytes
    if n == 0:
        return lib.ferry_checksum_of(None, 0)
    buf = (ctypes.c_char * n).from_buffer_copy(view) if view.readonly else (ctypes.c_char * n).from_buffer(view)
    return lib.ferry_checksum_of(ctypes.addressof(buf), n)
