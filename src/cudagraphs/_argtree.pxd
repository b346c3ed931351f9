# The compiled form of _argtree.py (Cython's pure-Python mode: the .py is the one source): the
# spec of a positional call and the tree of a call's result, as C functions.
# docs/architecture.md, "The compiled part", says what may be declared here and why.

cimport cython

# (module globals the calls read: C globals, read without a dictionary lookup, which Python 3.12
# and later make compiled code do for every global it reads)
cdef tuple _LEAF
cdef tuple _POSITIONAL

@cython.locals(specs=tuple)
cpdef object positional_spec(Py_ssize_t n)
cpdef object unflatten(object spec, list leaves)
