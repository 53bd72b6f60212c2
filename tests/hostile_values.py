"""Hypothesis strategies for what a hostile or careless client sends, shared by the services' property tests.

Values are JSON-shaped (what a parser hands the service): text with lone surrogates (valid JSON through a \\ud800
escape), numbers past every bound, NaN and infinities, deep and wide containers, and the wrong type for every field.
`json_text` renders them the way the wire carries them (ensure_ascii, so a surrogate travels as an escape).
"""

from __future__ import annotations

import json
import struct
import zlib

from hypothesis import strategies as st

SURROGATE = "\ud800"

_chars = st.one_of(
    st.characters(exclude_categories=[]), st.characters(categories=["Cs"]), st.sampled_from('\0\n"\\%&<')
)
# lone surrogates, controls and quoting characters included (st.text would leave the surrogates out)
any_text = st.lists(_chars, max_size=24).map("".join)
surrogate_text = st.builds(lambda a, b: f"{a}{SURROGATE}{b}", st.text(max_size=6), st.text(max_size=6))
huge_ints = st.one_of(st.integers(min_value=2**63, max_value=10**300), st.integers(max_value=-1, min_value=-(10**300)))
numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=True, allow_infinity=True), huge_ints
)
plain_text = st.text(max_size=16)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    numbers,
    plain_text,
    plain_text,
    st.text(alphabet='\0\n"\\%&<', max_size=4),
    surrogate_text,
)
keys = st.one_of(st.text(max_size=8), st.text(max_size=8), st.text(max_size=8), surrogate_text)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=12,
)


# Content types a body may arrive with, right or wrong for it.
CONTENT_TYPES = ("application/json", "multipart/form-data", "multipart/form-data; boundary=b",
                 "application/x-www-form-urlencoded", "text/plain", "", "application/json; charset=utf-16")  # fmt: skip
raw_bodies = st.tuples(st.binary(max_size=300), st.sampled_from(CONTENT_TYPES))


def anything_or(valid: st.SearchStrategy, hostile: st.SearchStrategy | None = None) -> st.SearchStrategy:
    """A field's value: mostly a valid one (so that requests reach the later checks), else `hostile` or any JSON
    value at all."""
    return st.one_of(valid, valid, valid, hostile if hostile is not None else json_values, json_values)


def one_field_hostile(
    valid: dict[str, st.SearchStrategy], hostile: dict[str, st.SearchStrategy], optional: tuple[str, ...] = ()
) -> st.SearchStrategy:
    """Request objects that are valid but for one field (its own hostile values, or any JSON value), so that every
    field's own checks are reached; now and then an unknown field too; and a fifth fully random objects."""

    @st.composite
    def build(draw):
        target = draw(st.sampled_from([*valid, None]))
        out = {}
        for name, strategy in valid.items():
            if name == target:
                out[name] = draw(st.one_of(hostile.get(name, json_values), json_values))
            elif name not in optional or draw(st.booleans()):
                out[name] = draw(strategy)
        if draw(st.integers(0, 9)) == 9:  # hypothesis leans to small integers: 9 is the rare case
            out[draw(keys)] = draw(json_values)
        return out

    return st.one_of(build(), build(), build(), build(), st.dictionaries(keys, json_values, max_size=6))


def json_text(value) -> str:
    return json.dumps(value, ensure_ascii=True, allow_nan=True)


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def png_header(width: int, height: int) -> bytes:
    """A PNG that declares width x height but holds almost nothing: what a decompression bomb looks like before
    decoding (a tiny file, a huge canvas)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    )


def multipart(fields: dict[str, bytes | str], boundary: str = "tfboundary") -> tuple[bytes, str]:
    """(body, content type) of a form; values go as given (bytes) or UTF-8 with surrogates escaped."""
    out = b""
    for name, value in fields.items():
        data = value if isinstance(value, bytes) else value.encode("utf-8", "backslashreplace")
        safe = name.encode("utf-8", "backslashreplace").replace(b'"', b"'")
        out += b"--" + boundary.encode() + b'\r\nContent-Disposition: form-data; name="' + safe + b'"\r\n\r\n'
        out += data + b"\r\n"
    return out + b"--" + boundary.encode() + b"--\r\n", f"multipart/form-data; boundary={boundary}"


def rss_bytes() -> int:
    """Resident memory after a full GC and, on glibc, malloc_trim: freed memory the allocator's per-thread arenas
    keep (each session thread may get its own) is returned first, so what is left is memory still held."""
    import ctypes
    import ctypes.util
    import gc

    import psutil

    gc.collect()
    libc_name = ctypes.util.find_library("c")
    if libc_name:
        trim = getattr(ctypes.CDLL(libc_name), "malloc_trim", None)
        if trim is not None:
            trim(0)
    return psutil.Process().memory_info().rss
