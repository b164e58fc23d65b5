"""ferry.h and the ctypes declarations of ferry._c must agree: every function, its return and argument
types, the chunk struct and the status codes."""
import ctypes
import re
from pathlib import Path

from ferry import _c

HEADER = Path(__file__).resolve().parents[2] / "include" / "ferry" / "c" / "ferry.h"

P = ctypes.POINTER
C_TYPES = {
    "void": None, "int": ctypes.c_int, "double": ctypes.c_double, "size_t": ctypes.c_size_t,
    "uintptr_t": _c.c_uintptr, "uint64_t": ctypes.c_uint64, "uint32_t": ctypes.c_uint32,
    "int32_t": ctypes.c_int32, "uint16_t": ctypes.c_uint16, "uint8_t": ctypes.c_uint8,
    "const char*": ctypes.c_char_p, "char*": ctypes.c_void_p, "char**": P(ctypes.c_void_p),
    "void*": ctypes.c_void_p, "const void*": ctypes.c_void_p, "void**": P(ctypes.c_void_p),
    "const void* const*": P(ctypes.c_void_p), "const size_t*": P(ctypes.c_size_t),
    "size_t*": P(ctypes.c_size_t), "const int64_t*": P(ctypes.c_int64), "uint64_t*": P(ctypes.c_uint64),
    "int*": P(ctypes.c_int), "ferry_chunk_fn": _c.CHUNK_FN,
}


def ctype_of(text: str):
    text = re.sub(r"\s*\*", "*", " ".join(text.split()))
    if text in C_TYPES:
        return C_TYPES[text]
    m = re.fullmatch(r"(ferry_[a-z]+)(\**)", text)
    assert m, f"ferry.h uses a type the test does not know: {text!r}"
    return {"*": ctypes.c_void_p, "**": P(ctypes.c_void_p)}[m.group(2)]


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
    for name, (ret, args) in decls.items():
        py_ret, py_args = _c.DECLARATIONS[name]
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
