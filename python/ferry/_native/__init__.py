"""ferry's native layer: the one place above the declaration table (ferry._c) that calls libferry_c.so.

Each module holds native objects with Python signatures (options in as keyword arguments, results out as
Python objects), built on `_base.NativeObject`: they are the only modules besides ferry._c that import
ctypes, build ctypes arrays or parse the library's JSON (tests/python/test_native.py keeps it so).
ferry's features (ferry.Device, ferry.analyze, the sinks, ferry.torch) speak tensors, streams and hooks
over them.
"""
from ._base import Lifecycle, NativeObject

__all__ = ["Lifecycle", "NativeObject"]
