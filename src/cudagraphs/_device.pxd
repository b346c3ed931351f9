# The compiled form of _device.py (Cython's pure-Python mode: the .py is the one source): the
# default device's lookup, asked by every constructor and op, as C functions. Device and Stream
# stay Python classes (the C part reads a Stream's __slots__).

from cudagraphs._config cimport settings
from cudagraphs._fields cimport DeviceFields, StreamFields

cimport cython

# (module globals the hot paths read: C globals, read without a dictionary lookup, which Python
# 3.12 and later make compiled code do for every global it reads)
cdef object _CURRENT_VAR
cdef list _DEFAULT_DEVICE

cpdef object current_device()
cpdef object as_device(object device, str what=*)
cdef extern from *:
    """
    /* var.get() through the C API (a ContextVar with a default: never unset) */
    static PyObject *_context_get(PyObject *var) {
        PyObject *value = NULL;
        if (PyContextVar_Get(var, NULL, &value) < 0) return NULL;
        if (value == NULL) PyErr_SetString(PyExc_LookupError, "a ContextVar without a value");
        return value;
    }
    """
    object _context_get(object var)

@cython.locals(stream=StreamFields)
cpdef object _current_stream_of(DeviceFields device)

cpdef bint _closed(StreamFields stream) except -1
cpdef object _live(StreamFields stream)
