# The compiled form of _update.py (Cython's pure-Python mode: the .py is the one source; this file
# types the comparison of two graphs' node records).
# docs/architecture.md, "The compiled part", says what may be declared here and why.

cimport cython
from cudagraphs._capi cimport cg_first_difference, cg_first_not_none

# (module globals the comparison reads: C globals, read without a dictionary lookup, which Python
# 3.12 and later make compiled code do for every global it reads)
cdef Py_ssize_t _HANDLE, _KIND, _NAME

cpdef Py_ssize_t _first_difference(list mine, list theirs, Py_ssize_t kind, Py_ssize_t name) except -2

cpdef bint _has_handles(list records) except -1
