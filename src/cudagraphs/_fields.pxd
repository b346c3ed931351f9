# The compiled form of _fields.py (Cython's pure-Python mode: the .py is the one source).
# docs/architecture.md, "The compiled part", says what may be declared here and why.

# (public: its C struct has a name, so that the offsets of its fields can be given to the C part)
cdef public class StreamFields [object CgStream, type CgStreamType]:
    cdef object __weakref__
    cdef public object _finalizer, _raw, _recording, _tokens, device, handle

# (public: its C struct has a name, so that the offsets of its fields can be given to the C part)
cdef public class ArrayFields [object CgArrayFields, type CgArrayFieldsType]:
    cdef object __weakref__
    cdef public object _arg, _block, _ptr, device, dtype, is_contiguous, shape, size, strides

cdef class DeviceFields:
    cdef dict __dict__
    cdef object __weakref__
    cdef public object allocator, backend, stream
    cdef public dict kernels

cdef extern from *:
    """
    /* The offsets of a Stream's fields, which the C part reads (a macro: it expands where the
       struct is known). */
    #define _stream_offsets() Py_BuildValue( \\
        "{s:n,s:n,s:n,s:n,s:n,s:n}", \\
        "_finalizer", (Py_ssize_t)offsetof(struct CgStream, _finalizer), \\
        "_raw", (Py_ssize_t)offsetof(struct CgStream, _raw), \\
        "_recording", (Py_ssize_t)offsetof(struct CgStream, _recording), \\
        "_tokens", (Py_ssize_t)offsetof(struct CgStream, _tokens), \\
        "device", (Py_ssize_t)offsetof(struct CgStream, device), \\
        "handle", (Py_ssize_t)offsetof(struct CgStream, handle))
    """
    dict _stream_offsets()
