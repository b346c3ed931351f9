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

