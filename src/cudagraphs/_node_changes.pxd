# The compiled form of _node_changes.py (Cython's pure-Python mode: the .py is the one source; this
# file types the repeat path of rebind: which records use an array, and their nodes' new arguments;
# cpdef where tests call them).
# docs/architecture.md, "The compiled part", says what may be declared here and why.

cimport cython
from cudagraphs._capi cimport (cg_api_load, cg_item, cg_nodes_add, cg_nodes_new, cg_nodes_set, cg_replaced_where,
                               cg_tuple6)

# (module globals the hot paths read: C globals, read without a dictionary lookup, which Python
# 3.12 and later make compiled code do for every global it reads)
cdef object _COPY, _KERNEL_LAUNCH, _KERNEL
cdef Py_ssize_t _HANDLE, _KIND, _VIEWS, _PATCH, _LAUNCH_VALUES, _LAUNCH_VIEWS

@cython.locals(i=Py_ssize_t, out=list)
cpdef list _users(list records, object key)

@cython.locals(i=Py_ssize_t)
cpdef Py_ssize_t _unpatchable(list records, list hits) except? -2

cdef object _used(object r)

@cython.locals(i=Py_ssize_t, got=int, function=size_t, fast=bint, pending=list, views=tuple, values=tuple)
cpdef _move(object backend, object exec_, list records, list hits, object key, object spec, object ptr)

@cython.locals(done=Py_ssize_t, k=Py_ssize_t, i=Py_ssize_t)
cdef bint _set(object backend, object exec_, list records, object batch, list pending) except -1

@cython.locals(children=Py_ssize_t)
cpdef list _unrecorded_users(object graph, object exec_, list records, list moves, bint patch)
