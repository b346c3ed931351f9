# The compiled form of _allocator.py (Cython's pure-Python mode: the .py is the one source; this
# file declares its hot classes as extension types with typed fields; the C Lock's functions are _capi's).
# docs/architecture.md, "The compiled part", says what may be declared here and why.

cimport cython
from cudagraphs._capi cimport cg_api_load, cg_lock_give, cg_lock_take, cg_pop
from cudagraphs._fields cimport DeviceFields, StreamFields

# (module globals the hot paths read: C globals, read without a dictionary lookup, which Python
# 3.12 and later make compiled code do for every global it reads)
cdef object _DEAD, _QUEUE

cdef class CachingAllocator

@cython.final
cdef class Block:
    cdef public object ptr, nbytes, device, owner, extra
    cdef object __weakref__

    @cython.locals(allocator=CachingAllocator)
    cpdef _release(self)


cdef class CachingAllocator:
    cdef object __weakref__
    cdef public DeviceFields _device
    cdef public object _backend, _ordinal, _lock
    cdef public dict _free, _waits, _live, _streams, _unordered
    cdef public tuple _last_key
    cdef public list _last_free
    cdef public object _last_handle
    cdef public Py_ssize_t _last_size
    cdef public Py_ssize_t _in_use, _reserved, _peak, _hits, _misses, _oom_retries

    @cython.locals(fields=StreamFields)
    cpdef Block malloc(self, object nbytes, object stream=*)
    @cython.locals(fields=StreamFields, small=Py_ssize_t, size=Py_ssize_t, key=tuple, cached=list)
    cpdef object raw_malloc(self, object nbytes, object stream=*)
    @cython.locals(key=tuple, cached=list)
    cpdef raw_free(self, object ptr, object streams=*)
    cpdef bint _try_cache(self, object ptr) except -1
    @cython.locals(key=tuple, cached=list, size=Py_ssize_t)
    cpdef _cache_locked(self, object ptr)


cdef Py_ssize_t _SMALL, _SMALL_STEP, _LARGE_STEP

@cython.locals(block=Block)
cpdef Block new_block(object device, object ptr, object nbytes, object owner)
