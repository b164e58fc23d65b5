"""ferry.h and the ctypes declarations of ferry._c must agree: every function, its return and argument
types (each handle its own ctypes type, each ferry_status return checked), the chunk struct and the
status codes."""
import ctypes
import re
from pathlib import Path

import pytest

from ferry import _c

HEADER = Path(__file__).resolve().parents[2] / "include" / "ferry" / "c" / "ferry.h"

P = ctypes.POINTER
C_TYPES = {
    "void": None, "int": ctypes.c_int, "double": ctypes.c_double, "size_t": ctypes.c_size_t,
    "uintptr_t": _c.c_uintptr, "uint64_t": ctypes.c_uint64, "uint32_t": ctypes.c_uint32,
    "int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64, "uint16_t": ctypes.c_uint16, "uint8_t": ctypes.c_uint8,
    "const char*": ctypes.c_char_p, "char*": ctypes.c_void_p, "char**": P(ctypes.c_void_p),
    "void*": ctypes.c_void_p, "const void*": ctypes.c_void_p, "void**": P(ctypes.c_void_p),
    "const void* const*": P(ctypes.c_void_p), "const size_t*": P(ctypes.c_size_t),
    "size_t*": P(ctypes.c_size_t), "const int64_t*": P(ctypes.c_int64), "uint64_t*": P(ctypes.c_uint64),
    "const int32_t*": P(ctypes.c_int32), "int32_t*": P(ctypes.c_int32), "const uint64_t*": P(ctypes.c_uint64),
    "const double*": P(ctypes.c_double), "const float*": P(ctypes.c_float),
    "int*": P(ctypes.c_int), "int64_t*": P(ctypes.c_int64), "uint8_t*": P(ctypes.c_uint8), "ferry_chunk_fn": _c.CHUNK_FN, "const ferry_kv_store*": P(_c.KvStore),
}


def ctype_of(text: str):
    text = re.sub(r"\s*\*", "*", " ".join(text.split()))
    if text in C_TYPES:
        return C_TYPES[text]
    m = re.fullmatch(r"(ferry_[a-z_]*[a-z])(\**)", text)
    assert m, f"ferry.h uses a type the test does not know: {text!r}"
    handle = _c.HANDLES.get(m.group(1))
    assert handle is not None, f"ferry.h has a handle type ferry/_c.py's HANDLES lacks: {m.group(1)}"
    return {"*": handle, "**": P(handle)}[m.group(2)]


def parse_header():
    src = re.sub(r"/\*.*?\*/", "", HEADER.read_text(), flags=re.S)
    decls = {}
    for m in re.finditer(r"FERRY_C_API\s+([^;(]*?)\b(ferry_\w+)\s*\(([^)]*)\)\s*;", src):
        ret, name, args = m.group(1), m.group(2), m.group(3).strip()
        params = [] if args in ("void", "") else [a.strip() for a in args.split(",")]
        arg_types = [ctype_of(re.sub(r"\s*\b\w+$", "", p)) for p in params]
        decls[name] = (ctype_of(ret), arg_types)
    return src, decls


def same(a, b) -> bool:
    if a is None or b is None:
        return a is b
    if a is b:
        return True
    if isinstance(a, type) and isinstance(b, type) and (issubclass(a, _c.Handle) or issubclass(b, _c.Handle)):
        return False  # a handle is its own type, never a void* nor another handle
    # POINTER(x) types are cached per x; compare the pointee for pointers, sizes and kinds otherwise.
    if hasattr(a, "_type_") and hasattr(b, "_type_") and issubclass(a, ctypes._Pointer) and issubclass(b, ctypes._Pointer):
        return same(a._type_, b._type_)
    return ctypes.sizeof(a) == ctypes.sizeof(b) and getattr(a, "_type_", None) == getattr(b, "_type_", None)


def test_every_declaration_matches_the_header():
    _, decls = parse_header()
    assert len(decls) > 40
    assert set(decls) == set(_c.DECLARATIONS), (
        f"only in ferry.h: {sorted(set(decls) - set(_c.DECLARATIONS))}; "
        f"only in ferry/_c.py: {sorted(set(_c.DECLARATIONS) - set(decls))}")
    statuses = set(re.findall(r"FERRY_C_API\s+int\s+(ferry_\w+)\s*\(", parse_header()[0])) - {"ferry_abi_version"}
    for name, (ret, args) in decls.items():
        py_ret, py_args = _c.DECLARATIONS[name]
        # Every function returning a ferry_status is declared as such, so its errcheck raises.
        assert (py_ret is _c.Status) == (name in statuses), f"{name}: ferry/_c.py returns {py_ret}"
        assert same(ret, py_ret), f"{name}: ferry.h returns {ret}, ferry/_c.py says {py_ret}"
        assert len(args) == len(py_args), f"{name}: ferry.h takes {len(args)} arguments, ferry/_c.py {len(py_args)}"
        for i, (a, b) in enumerate(zip(args, py_args)):
            assert same(a, b), f"{name}: argument {i} is {a} in ferry.h, {b} in ferry/_c.py"


def test_the_chunk_struct_and_status_codes_match_the_header():
    src, _ = parse_header()
    body = re.search(r"typedef struct ferry_chunk \{(.*?)\} ferry_chunk;", src, re.S).group(1)
    fields = [re.fullmatch(r"(.+?)\s*\b(\w+)", f.strip()).groups() for f in body.split(";") if f.strip()]
    assert [n for _, n in fields] == [n for n, _ in _c.Chunk._fields_]
    for (ctype, name), (_, py) in zip(fields, _c.Chunk._fields_):
        assert same(ctype_of(ctype), py), f"ferry_chunk.{name}: {ctype} vs {py}"
    codes = dict((k, int(v)) for k, v in re.findall(r"\b(FERRY_(?:OK|ERROR_\w+))\s*=\s*(\d+)", src))
    assert codes == _c.STATUS
    assert int(re.search(r"#define FERRY_C_ABI_VERSION (\d+)", src).group(1)) == _c.ABI_VERSION


def test_the_parser_sees_a_drift():
    # The check above must be able to fail: a declaration with one argument type changed is caught.
    _, decls = parse_header()
    ret, args = decls["ferry_egress_submit"]
    assert not same(args[1], ctypes.c_int)
    assert not same(decls["ferry_batch_dlpack"][1][2], ctypes.c_int64)


def test_a_handle_of_another_kind_is_refused_before_the_library_sees_it():
    # With one void* for every handle, an egress handle reached ferry_prefetch_slot_bytes (NULL here, so
    # the library refused it; a live one would have been read as a prefetcher's).
    wrong = _c.EgressHandle()
    with pytest.raises(ctypes.ArgumentError, match="expected a PrefetchHandle, got EgressHandle"):
        _c.lib.ferry_prefetch_slot_bytes(wrong, ctypes.byref(ctypes.c_size_t()))
    with pytest.raises(ctypes.ArgumentError, match="expected a PrefetchHandle, got c_void_p"):
        _c.lib.ferry_prefetch_slot_bytes(ctypes.c_void_p(), ctypes.byref(ctypes.c_size_t()))
    with pytest.raises(ctypes.ArgumentError):
        _c.lib.ferry_prefetch_next(_c.PrefetchHandle(), 0, ctypes.byref(_c.EgressHandle()))


def test_a_failing_status_raises_its_exception_with_the_librarys_message():
    # The errcheck of the declaration table, not each call site: NULL handles are refused by the library.
    with pytest.raises(_c.InvalidArgumentError, match="ferry_prefetch_slot_bytes") as e:
        _c.lib.ferry_prefetch_slot_bytes(_c.PrefetchHandle(), ctypes.byref(ctypes.c_size_t()))
    assert e.value.status == _c.STATUS["FERRY_ERROR_INVALID"]
    with pytest.raises(_c.InvalidArgumentError, match="'gpu'"):
        _c.lib.ferry_device_create(b"gpu", 0, ctypes.byref(_c.DeviceHandle()))
    # Success returns 0, so a call site's own check is harmless.
    h = _c.DeviceHandle()
    assert _c.lib.ferry_device_create(b"host", 0, ctypes.byref(h)) == 0
    _c.check(_c.lib.ferry_device_synchronize(h))
    _c.lib.ferry_device_destroy(h)
