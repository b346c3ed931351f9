# The compiled form of _array.py (Cython's pure-Python mode: the .py is the one source; this file
# declares DeviceArray as an extension type and types cudagraphs.empty's path).
# docs/architecture.md, "The compiled part", says what may be declared here and why.

cimport cython
from cudagraphs._allocator cimport Block, CachingAllocator
from cudagraphs._device cimport _current_stream_of, as_device
from cudagraphs._dtypes cimport normalize_dtype
from cudagraphs._fields cimport ArrayFields, DeviceFields

# (its fields are ArrayFields', which the layers below read typed)
cdef class DeviceArray(ArrayFields):
    pass

# (module globals the hot path reads: C globals, read without a dictionary lookup, which Python
# 3.12 and later make compiled code do for every global it reads)
cdef tuple _LAST_DIMS
cdef list _STRIDES_1D

cpdef tuple _shape(object shape)
cpdef tuple _strides_1d(Py_ssize_t itemsize)
cpdef object _prod(tuple shape)

@cython.locals(a=DeviceArray)
cpdef DeviceArray _new_array(
    type cls, object block, object ptr, object device, object shape, object strides, object dtype,
    object is_contiguous, object size)

@cython.locals(dev=DeviceFields, itemsize=Py_ssize_t, block=Block, allocator=CachingAllocator)
cpdef DeviceArray empty(object shape, object dtype=*, object device=*, object stream=*)
