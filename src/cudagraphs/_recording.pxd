# The compiled form of _recording.py (Cython's pure-Python mode: the .py is the one source; this
# file declares Recording an extension type with typed fields, and types submit's path).
# docs/architecture.md, "The compiled part", says what may be declared here and why.

cimport cython
from cudagraphs._capi cimport (cg_api_load, cg_first_none, cg_issue, cg_item, cg_launch, cg_mix, cg_thread_ident,
                               cg_tuple6, cg_type_in, cg_types_in)
from cudagraphs._fields cimport ArrayFields, StreamFields

# (module globals the hot paths read: C globals, read without a dictionary lookup, which Python
# 3.12 and later make compiled code do for every global it reads)
cdef object _BY_VALUE, _KERNEL, _NODE_RECORD
cdef Py_ssize_t _RECORD_KIND
cdef list _EXPIRING

cdef class Work:
    cdef public object arg, issue, kind, name, patch, refuse
    cdef public tuple keep, reads, writes

cdef class Recording:
    cdef object __weakref__
    cdef public object active, before, device, frees, invalid, memory, mode, plain, stream
    cdef public unsigned long thread
    cdef public unsigned long long signature
    cdef public dict conditions, loops
    cdef public list devices, joined, keep, nodes, streams

    cpdef object record(self, object stream, object kind, object issue, object arg, tuple reads, tuple writes,
                        tuple kept, object name, object patch, object refuse)
    @cython.locals(keep=list, arr=ArrayFields)
    cdef _keep_objects(self, tuple objs, object owners)

cdef bint _uses_expiring(object objs) except -1

@cython.locals(arr=ArrayFields)
cpdef object address(object a)
cpdef object array_address(ArrayFields arr)

@cython.locals(on=StreamFields)
cdef object _issue(object stream, object issue, object arg)

@cython.locals(arr=ArrayFields)
cpdef object view_of(object a)

cpdef object submit(object stream, Work work)

@cython.locals(on=StreamFields, rec=Recording)
cpdef object submit_parts(object stream, object kind, object issue, object arg, tuple reads, tuple writes,
                          tuple keep, object name, object patch, object refuse)

@cython.locals(on=StreamFields)
cpdef bint issue_launch(object stream, object packer, size_t function, object grid, object block,
                        unsigned shared_mem, object values, object args) except -1

@cython.locals(children=Py_ssize_t)
cpdef bint has_unrecorded(list records, Py_ssize_t count) except -1
