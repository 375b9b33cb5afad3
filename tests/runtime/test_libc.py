"""The C library's functions (kiln.runtime.libc): each lookup its own signature."""

from __future__ import annotations

import ctypes

from kiln.runtime.libc import libc_function


def test_two_lookups_of_one_name_keep_their_own_signatures() -> None:
    strlen = libc_function("strlen", ctypes.c_size_t, ctypes.c_char_p)
    raw = libc_function("strlen", ctypes.c_size_t, ctypes.c_void_p)
    assert strlen is not None and raw is not None
    assert strlen.argtypes == (ctypes.c_char_p,) and raw.argtypes == (ctypes.c_void_p,)
    text = ctypes.create_string_buffer(b"kiln")
    assert strlen(b"kiln") == 4 and raw(ctypes.addressof(text)) == 4
    assert libc_function("kiln_no_such_function", ctypes.c_int) is None
