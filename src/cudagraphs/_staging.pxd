# The compiled form of _staging.py (Cython's pure-Python mode: the .py is the one source; this
# file declares the classes a graphed call reads on every call as extension types with typed
# fields, and types the staging of that call's inputs).
# docs/architecture.md, "The compiled part", says what may be declared here and why.

cimport cython

@cython.final
@cython.no_gc
cdef class Input:
    cdef public object obj, lib, ptr, shape, dtype
    cdef public bint contiguous

@cython.locals(i=Input)
cpdef Input new_input(object obj, object lib, object ptr, object shape, object dtype, bint contiguous)

@cython.final
cdef class Entry:
    cdef public object bucket, graph, out_spec, memory, eager
    cdef public list copies, sources, held, scratch, static, outs, out_libs
    cdef public Py_ssize_t hits

@cython.final
cdef class Staging:
    cdef public object device, buckets, dim, pad_value
    cdef public dict buffers

    cpdef tuple shape(self, tuple shape, object bucket)
    @cython.locals(i=Input, j=Py_ssize_t, copies=list, static=list)
    cpdef stage(self, Entry entry, list ins, object n, object bucket, object stream)
    cpdef bint point(self, Entry entry, Py_ssize_t j, Input i, object stream) except -1
