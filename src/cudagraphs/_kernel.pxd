# The compiled form of _kernel.py (Cython's pure-Python mode: the .py is the one source; this file
# declares Kernel and its argument checks, _Arg, extension types with typed fields, and types the
# launch's path). docs/architecture.md, "The compiled part", says what may be declared here and why.

cimport cython
from cudagraphs._capi cimport cg_put, cg_tuple6, cg_values
from cudagraphs._device cimport _current_stream_of
from cudagraphs._fields cimport ArrayFields, DeviceFields, StreamFields

# (module globals the hot paths read: C globals, read without a dictionary lookup, which Python
# 3.12 and later make compiled code do for every global it reads)
cdef object _DEVICE, _STREAM, _KERNEL_LAUNCH
from cudagraphs._recording cimport array_address, issue_launch, submit_parts, view_of

@cython.final
cdef class _Arg:
    cdef public object dtype, high, kind, low, narrow, pointee, where
    cdef public bint by_bytes, pointer

    @cython.locals(arr=ArrayFields)
    cpdef object convert(self, object a, object device)
    cpdef bytes _bytes(self, object a)

@cython.final
cdef class _Plan:
    cdef public object device, fn, issue, packer
    cdef public bint describe
    cdef public size_t function

cdef object _NO_PLAN

cdef class Kernel:
    cdef dict __dict__
    cdef object __weakref__
    cdef public list _convert
    cdef public list _spare
    cdef public tuple _dims
    cdef public _Plan _last
    cdef public dict _plans
    cdef public object fast, name

    @cython.locals(convert=list, values=list, n=Py_ssize_t, i=Py_ssize_t, arg=_Arg)
    cdef _launch(self, object grid, object block, tuple args, object stream, object shared_mem, object device)
    @cython.locals(values=list)
    cdef inline list _lend_values(self, Py_ssize_t n)
    @cython.locals(on=StreamFields, plan=_Plan, n=Py_ssize_t, i=Py_ssize_t)
    cdef _enqueue(self, object device, object stream, object grid, object block, object shared_mem,
                  object values, object args, object writes)

cpdef object _device_of(tuple args)
