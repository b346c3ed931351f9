# The compiled form of _graph.py (Cython's pure-Python mode: the .py is the one source; this file
# declares Graph an extension type with typed fields, and types replay's path).
# docs/architecture.md, "The compiled part", says what may be declared here and why.

cimport cython
from cudagraphs._capi cimport cg_api_load, cg_graph_launch
from cudagraphs._device cimport _current_stream_of, _live
from cudagraphs._fields cimport DeviceFields, StreamFields

# (module globals replay reads: C globals, read without a dictionary lookup, which Python 3.12
# and later make compiled code do for every global it reads)
cdef dict _ACTIVE
cdef object _get_ident, _Stream

cdef class Graph:
    cdef object __weakref__
    cdef public object _auto_free, _bodies, _broken, _count, _exec, _finalizer, _holders, _launch
    cdef public object _moves, _nodes, _patched, _rec, _records, _res, _rng, _sig, _traced, _uploaded
    cdef public object output, pool, state
    cdef public bint _later
    cdef public size_t _fast_exec
    cdef public DeviceFields device
    cdef public StreamFields stream
    cdef public Py_ssize_t replays

    @cython.locals(on=StreamFields, current=StreamFields)
    cpdef replay(self, stream=*)
    @cython.locals(s=StreamFields)
    cpdef _check_stream(self, object stream)
