# The compiled form of _config.py (Cython's pure-Python mode: the .py is the one source): the
# settings in force, read by every constructor and op, as a C function.

# (the settings in force: a C global, read without a dictionary lookup, which Python 3.12 and
# later make compiled code do for every global it reads)
cdef object _current

cpdef object settings()
