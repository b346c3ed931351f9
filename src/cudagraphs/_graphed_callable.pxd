# The compiled form of _graphed_callable.py (Cython's pure-Python mode: the .py is the one source;
# this file declares the classes a graphed call reads as extension types with typed fields, and
# types the call's path).
# docs/architecture.md, "The compiled part", says what may be declared here and why.

cimport cython
from cudagraphs._argtree cimport positional_spec, unflatten
from cudagraphs._array cimport DeviceArray, _new_array
from cudagraphs._capi cimport cg_api_load, cg_lock_give, cg_lock_take
from cudagraphs._device cimport _current_stream_of
from cudagraphs._fields cimport DeviceFields, StreamFields
from cudagraphs._graph cimport Graph
from cudagraphs._staging cimport Entry, Input, Staging, new_input

# (module globals a call reads: C globals, read without a dictionary lookup, which Python 3.12
# and later make compiled code do for every global it reads)
cdef set _ARRAY_TYPES
cdef object _MISSED

@cython.final
cdef class _Lease:
    cdef public Py_ssize_t calls, made
    cdef public object lock, name

    cpdef count(self)

cdef class GraphOutput(DeviceArray):
    cdef public _Lease _lease
    cdef public Py_ssize_t _call

    @staticmethod
    @cython.locals(out=GraphOutput)
    cdef GraphOutput _expiring(DeviceArray base, _Lease lease)

@cython.final
cdef class _Armed:
    cdef public Entry entry
    cdef public list ins
    cdef public object source
    cdef public StreamFields stream

cdef bint _all_arrays(tuple args) except -1

@cython.locals(a=DeviceArray)
cpdef Input _describe(object obj, DeviceFields device)

@cython.locals(out=GraphOutput)
cdef _still_valid(object leaves, _Lease lease)

cdef class GraphedCallable:
    cdef object __weakref__
    cdef public object fn, buckets, dim, warmup, pool, mode, copy_outputs, pad_value, fallback
    cdef public object generators
    cdef public DeviceFields device
    cdef public object _stream, _capture_stream, _lock, _last, _trainer
    cdef public dict _entries
    cdef public _Armed _armed
    cdef public Staging _staging
    cdef public _Lease _lease
    cdef public Py_ssize_t _misses, _repeats

    @cython.locals(staging=Staging, i=Input, entry=Entry, stream=StreamFields)
    cdef _call(self, tuple args, dict kwargs)
    @cython.locals(j=Py_ssize_t)
    cdef _arm(self, Entry entry, tuple args, list ins, object source, StreamFields stream)
    @cython.locals(
        ins=list, now=list, i=Input, j=Py_ssize_t, a=DeviceArray, stream=StreamFields, entry=Entry,
        device=DeviceFields, contiguous=bint)
    cdef _repeat(self, _Armed armed, tuple args)
    @cython.locals(entry=Entry, stream=StreamFields)
    cpdef Entry _entry(self, tuple key, object spec, list ins, object n, object bucket, object stream)
    @cython.locals(graph=Graph)
    cdef _replayed(self, Entry entry, tuple args, object kwargs, object leaves, object n, object bucket,
                   StreamFields stream)
    @cython.locals(stream=StreamFields)
    cpdef _begin_on(self, object stream)
    @cython.locals(i=Input)
    cpdef _stream_source(self, list ins)
    cpdef _stream_of(self, object source)
    @cython.locals(lease=_Lease)
    cpdef _outputs(self, Entry entry, object n, object bucket, object stream)
