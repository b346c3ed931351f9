# The compiled form of _builtin_kernels.py (Cython's pure-Python mode: the .py is the one source):
# run(), the launch of every built-in op, compiled with its module.
# docs/architecture.md, "The compiled part", says what may be declared here and why.

cimport cython

# (module globals the hot paths read: C globals, read without a dictionary lookup, which Python
# 3.12 and later make compiled code do for every global it reads)
cdef object _BLOCK
cdef list _LAST_GRID, _LAST_RUN
cdef dict _RUNS

from cudagraphs._kernel cimport Kernel
from cudagraphs._recording cimport address

@cython.locals(last=tuple)
cpdef tuple grid_of(object n, object cap)

@cython.locals(kernel=Kernel, plan=tuple, last=tuple, values=list, i=Py_ssize_t, count=Py_ssize_t)
cpdef run(str name, object dtype, object device, object stream, object n, tuple args, object writes=*)
