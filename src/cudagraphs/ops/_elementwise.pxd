# The compiled form of ops/_elementwise.py (Cython's pure-Python mode: the .py is the one source):
# the element-wise ops, compiled with their module.
# docs/architecture.md, "The compiled part", says what may be declared here and why.

from cudagraphs._builtin_kernels cimport run
from cudagraphs._device cimport _current_stream_of

cimport cython
from cudagraphs._fields cimport ArrayFields, DeviceFields

# (module globals the hot paths read: C globals, read without a dictionary lookup, which Python
# 3.12 and later make compiled code do for every global it reads)
cdef object _DEVICE_ARRAY
cdef tuple _ARITH_DTYPES_C

@cython.locals(head=ArrayFields, arr=ArrayFields)
cpdef object _arrays(str op, tuple names, tuple arrays)
cpdef _arith(str op, object dtype)

@cython.locals(x=ArrayFields, y=ArrayFields, z=ArrayFields)
cpdef object add(object a, object b, object out=*, object stream=*)
