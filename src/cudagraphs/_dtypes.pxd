# The compiled form of _dtypes.py (Cython's pure-Python mode: the .py is the one source): its
# lookup, called by every array constructor, as a C function.

# (module globals the lookup reads: C globals, read without a dictionary lookup, which Python
# 3.12 and later make compiled code do for every global it reads)
cdef dict _SUPPORTED, _BY_DTYPE
cdef tuple _LAST

cpdef object normalize_dtype(object dtype)
