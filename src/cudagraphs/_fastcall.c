/* The driver calls of the hot paths, called from Python at C's cost.
 *
 * cuda.bindings spends about 1 us on any driver call and 2 us on
 * cuLaunchKernel (measured on an H100 host: a bare bindings cuLaunchKernel
 * took 6.2 us where C's <<<>>> took 4.0), more than every target of the
 * launch, copy, alloc and node-update paths allows. This module calls the
 * same driver entry points through pointers that the cuda backend gets from
 * cuGetProcAddress (so the versions are the ones cuda.bindings would call)
 * and hands over with bind(); it needs no CUDA header or library to build.
 *
 * Each function takes the arguments of its cuda.bindings namesake (handles
 * as ints or as cuda.bindings handle objects, which convert with int()) and
 * returns what that returns: a tuple starting with the CUresult as an int.
 * The GIL is released around every driver call, as cuda.bindings does: a
 * launch can block on a full queue behind a host function that needs the GIL.
 *
 * Beside these trampolines it holds what must be C to be fast and takes no
 * decision: a kernel's Packer (its arguments' bytes, packed on the C stack
 * and launched), batches of kernel nodes' new parameters, and a Lock that
 * compiled code takes without a call. The Python code (compiled by Cython
 * where built) decides everything: what to launch, on which stream, whether
 * a capture records it; it reaches these through the capsule `api`
 * (_fastcall_api.h). docs/architecture.md, "The compiled part", says why.
 *
 * Optional: when it cannot be built or imported, or CUDAGRAPHS_FASTCALL=0,
 * the cuda backend calls cuda.bindings instead.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <string.h>

#define CUDAGRAPHS_FASTCALL_PROVIDER
#include "_fastcall_api.h"

typedef int CUresult;
typedef void *handle;
typedef unsigned long long devptr;

typedef CUresult (*launch_t)(handle, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             handle, void **, void **);
typedef CUresult (*graph_launch_t)(handle, handle);
typedef CUresult (*copy_dd_t)(devptr, devptr, size_t, handle);
typedef CUresult (*copy_hd_t)(devptr, const void *, size_t, handle);
typedef CUresult (*copy_dh_t)(void *, devptr, size_t, handle);
typedef CUresult (*memset_t)(devptr, unsigned char, size_t, handle);
typedef CUresult (*alloc_t)(devptr *, size_t, handle, handle);
typedef CUresult (*free_t)(devptr, handle);
typedef CUresult (*event_record_t)(handle, handle);
typedef CUresult (*wait_event_t)(handle, handle, unsigned);
typedef CUresult (*node_set_t)(handle, handle, const void *);
typedef CUresult (*ctx_get_t)(handle *);
typedef CUresult (*copy_node_set_t)(handle, handle, const void *, handle);

enum {
    LAUNCH, GRAPH_LAUNCH, COPY_DD, COPY_HD, COPY_DH, MEMSET, ALLOC, FREE, EVENT_RECORD, WAIT_EVENT,
    NODE_SET, CTX_GET, COPY_NODE_SET, COUNT
};
static const char *NAMES[COUNT] = {
    "cuLaunchKernel", "cuGraphLaunch", "cuMemcpyDtoDAsync", "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync",
    "cuMemsetD8Async", "cuMemAllocFromPoolAsync", "cuMemFreeAsync", "cuEventRecord", "cuStreamWaitEvent",
    "cuGraphExecKernelNodeSetParams", "cuCtxGetCurrent", "cuGraphExecMemcpyNodeSetParams",
};
static void *fns[COUNT];

/* An address from an int or from anything int() accepts (cuda.bindings handles). */
static int as_address(PyObject *o, uintptr_t *out) {
    if (PyLong_CheckExact(o)) {
        unsigned long long v = PyLong_AsUnsignedLongLong(o);
        if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        *out = (uintptr_t)v;
        return 0;
    }
    if (o == Py_None) {
        *out = 0;
        return 0;
    }
    /* ints and what has __index__ (numpy integers), else handles that convert with int() and are
       no number of another kind (a float, a Decimal, a buffer of digits) */
    PyNumberMethods *num = Py_TYPE(o)->tp_as_number;
    int index = PyIndex_Check(o);
    if (!index && (PyUnicode_Check(o) || PyObject_CheckBuffer(o) || (num != NULL && num->nb_float != NULL))) {
        PyErr_Format(PyExc_TypeError, "a handle or address must be an int, got %.80s", Py_TYPE(o)->tp_name);
        return -1;
    }
    PyObject *n = index ? PyNumber_Index(o) : PyNumber_Long(o);
    if (n == NULL) return -1;
    unsigned long long v = PyLong_AsUnsignedLongLong(n);
    Py_DECREF(n);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *out = (uintptr_t)v;
    return 0;
}

/* Drop the exception of a call the Python path will redo (0), unless it is not an Exception
   (KeyboardInterrupt, SystemExit): that one stays set, and the caller returns it (-1). */
static int cleared(void) {
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception)) return -1;
    PyErr_Clear();
    return 0;
}

/* An int (or anything with __index__, as numpy integers) as C's unsigned. */
static int as_unsigned(PyObject *o, unsigned *out) {
    PyObject *n = PyNumber_Index(o);
    if (n == NULL) return -1;
    unsigned long v = PyLong_AsUnsignedLong(n);
    Py_DECREF(n);
    if (v == (unsigned long)-1 && PyErr_Occurred()) return -1;
    if (v > 0xFFFFFFFFul) {
        PyErr_SetString(PyExc_OverflowError, "a launch dimension does not fit 32 bits");
        return -1;
    }
    *out = (unsigned)v;
    return 0;
}

static int as_size(PyObject *o, size_t *out) {
    PyObject *n = PyNumber_Index(o);
    if (n == NULL) return -1;
    size_t v = PyLong_AsSize_t(n);
    Py_DECREF(n);
    if (v == (size_t)-1 && PyErr_Occurred()) return -1;
    *out = v;
    return 0;
}

/* The entry point of `which`, read while the GIL is held (bind() may change the table from
   another thread once it is released), or NULL with an exception set. */
static void *entry(Py_ssize_t nargs, Py_ssize_t want, int which) {
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments, got %zd", NAMES[which], want, nargs);
        return NULL;
    }
    void *fn = fns[which];
    if (fn == NULL) PyErr_Format(PyExc_RuntimeError, "%s is not bound (call bind() first)", NAMES[which]);
    return fn;
}

static PyObject *result(CUresult err) {
    PyObject *code = PyLong_FromLong(err);
    if (code == NULL) return NULL;
    PyObject *out = PyTuple_Pack(1, code);
    Py_DECREF(code);
    return out;
}

/* cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra) */
static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uintptr_t f, stream, params, extra;
    unsigned d[7];
    void *fn = entry(nargs, 11, LAUNCH);
    if (fn == NULL || as_address(args[0], &f)) return NULL;
    for (int i = 0; i < 7; ++i)
        if (as_unsigned(args[1 + i], &d[i])) return NULL;
    if (as_address(args[8], &stream) || as_address(args[9], &params) || as_address(args[10], &extra))
        return NULL;
    CUresult err;
    Py_BEGIN_ALLOW_THREADS
    err = ((launch_t)fn)((handle)f, d[0], d[1], d[2], d[3], d[4], d[5], d[6], (handle)stream,
                                  (void **)params, (void **)extra);
    Py_END_ALLOW_THREADS
    return result(err);
}

/* Calls of two handles: cuGraphLaunch(exec, stream), cuEventRecord(event, stream),
   cuMemFreeAsync(ptr, stream). */
static PyObject *two(int which, PyObject *const *args, Py_ssize_t nargs) {
    uintptr_t a, b;
    void *fn = entry(nargs, 2, which);
    if (fn == NULL || as_address(args[0], &a) || as_address(args[1], &b)) return NULL;
    CUresult err;
    Py_BEGIN_ALLOW_THREADS
    if (which == FREE)
        err = ((free_t)fn)((devptr)a, (handle)b);
    else
        err = ((graph_launch_t)fn)((handle)a, (handle)b);
    Py_END_ALLOW_THREADS
    return result(err);
}

static PyObject *graph_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return two(GRAPH_LAUNCH, args, nargs);
}

static PyObject *event_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return two(EVENT_RECORD, args, nargs);
}

static PyObject *mem_free(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return two(FREE, args, nargs);
}

/* cuMemcpy{DtoD,HtoD,DtoH}Async(dst, src, nbytes, stream): addresses as ints. */
static PyObject *copy(int which, PyObject *const *args, Py_ssize_t nargs) {
    uintptr_t dst, src, stream;
    size_t n;
    void *fn = entry(nargs, 4, which);
    if (fn == NULL || as_address(args[0], &dst) || as_address(args[1], &src) || as_size(args[2], &n) ||
        as_address(args[3], &stream))
        return NULL;
    CUresult err;
    Py_BEGIN_ALLOW_THREADS
    if (which == COPY_DD)
        err = ((copy_dd_t)fn)((devptr)dst, (devptr)src, n, (handle)stream);
    else if (which == COPY_HD)
        err = ((copy_hd_t)fn)((devptr)dst, (const void *)src, n, (handle)stream);
    else
        err = ((copy_dh_t)fn)((void *)dst, (devptr)src, n, (handle)stream);
    Py_END_ALLOW_THREADS
    return result(err);
}

static PyObject *copy_dd(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return copy(COPY_DD, args, nargs);
}

static PyObject *copy_hd(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return copy(COPY_HD, args, nargs);
}

static PyObject *copy_dh(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return copy(COPY_DH, args, nargs);
}

/* cuMemsetD8Async(dst, value, nbytes, stream) */
static PyObject *memset_d8(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uintptr_t dst, stream;
    unsigned value;
    size_t n;
    void *fn = entry(nargs, 4, MEMSET);
    if (fn == NULL || as_address(args[0], &dst) || as_unsigned(args[1], &value) || as_size(args[2], &n) ||
        as_address(args[3], &stream))
        return NULL;
    if (value > 255) {
        PyErr_Format(PyExc_OverflowError, "cuMemsetD8Async sets bytes, got the value %u", value);
        return NULL;
    }
    CUresult err;
    Py_BEGIN_ALLOW_THREADS
    err = ((memset_t)fn)((devptr)dst, (unsigned char)value, n, (handle)stream);
    Py_END_ALLOW_THREADS
    return result(err);
}

/* cuMemAllocFromPoolAsync(nbytes, pool, stream) -> (err, address) */
static PyObject *alloc(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uintptr_t pool, stream;
    size_t n;
    devptr ptr = 0;
    void *fn = entry(nargs, 3, ALLOC);
    if (fn == NULL || as_size(args[0], &n) || as_address(args[1], &pool) || as_address(args[2], &stream))
        return NULL;
    CUresult err;
    Py_BEGIN_ALLOW_THREADS
    err = ((alloc_t)fn)(&ptr, n, (handle)pool, (handle)stream);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(iK)", err, ptr);
}

/* cuStreamWaitEvent(stream, event, flags) */
static PyObject *wait_event(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uintptr_t stream, event;
    unsigned flags;
    void *fn = entry(nargs, 3, WAIT_EVENT);
    if (fn == NULL || as_address(args[0], &stream) || as_address(args[1], &event) ||
        as_unsigned(args[2], &flags))
        return NULL;
    CUresult err;
    Py_BEGIN_ALLOW_THREADS
    err = ((wait_event_t)fn)((handle)stream, (handle)event, flags);
    Py_END_ALLOW_THREADS
    return result(err);
}

/* cuGraphExecKernelNodeSetParams(exec, node, params): params is the address of a
   CUDA_KERNEL_NODE_PARAMS the caller keeps (see backends/cuda.py). */
static PyObject *node_set(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uintptr_t exec, node, params;
    void *fn = entry(nargs, 3, NODE_SET);
    if (fn == NULL || as_address(args[0], &exec) || as_address(args[1], &node) || as_address(args[2], &params))
        return NULL;
    CUresult err;
    Py_BEGIN_ALLOW_THREADS
    err = ((node_set_t)fn)((handle)exec, (handle)node, (const void *)params);
    Py_END_ALLOW_THREADS
    return result(err);
}

typedef struct { /* CUDA_MEMCPY3D */
    size_t srcXInBytes, srcY, srcZ, srcLOD;
    int srcMemoryType;
    const void *srcHost;
    devptr srcDevice;
    handle srcArray;
    void *reserved0;
    size_t srcPitch, srcHeight;
    size_t dstXInBytes, dstY, dstZ, dstLOD;
    int dstMemoryType;
    void *dstHost;
    devptr dstDevice;
    handle dstArray;
    void *reserved1;
    size_t dstPitch, dstHeight;
    size_t WidthInBytes, Height, Depth;
} memcpy3d_t;

#define CU_MEMORYTYPE_DEVICE 2

/* cuGraphExecMemcpyNodeSetParams(exec, node, dst, src, nbytes): a copy node of an executable
   graph set to copy nbytes from device address src to dst, in the calling thread's current
   context (cuCtxGetCurrent), as the node was made. A thread with no current context gets
   CUDA_ERROR_INVALID_CONTEXT without the call (the driver crashes on a NULL context). */
static PyObject *copy_node_set(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uintptr_t exec, node, dst, src;
    size_t n;
    void *fn = entry(nargs, 5, COPY_NODE_SET);
    if (fn == NULL || as_address(args[0], &exec) || as_address(args[1], &node) || as_address(args[2], &dst) ||
        as_address(args[3], &src) || as_size(args[4], &n))
        return NULL;
    void *get = fns[CTX_GET];
    if (get == NULL) return PyErr_Format(PyExc_RuntimeError, "cuCtxGetCurrent is not bound (call bind() first)");
    memcpy3d_t p = {0};
    p.srcMemoryType = p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    p.srcDevice = (devptr)src, p.dstDevice = (devptr)dst;
    p.WidthInBytes = n, p.Height = 1, p.Depth = 1;
    CUresult err;
    handle ctx = NULL;
    Py_BEGIN_ALLOW_THREADS
    err = ((ctx_get_t)get)(&ctx);
    if (!err && ctx == NULL) err = 201; /* CUDA_ERROR_INVALID_CONTEXT */
    if (!err) err = ((copy_node_set_t)fn)((handle)exec, (handle)node, &p, ctx);
    Py_END_ALLOW_THREADS
    return result(err);
}

/* ---- Kernel arguments, packed: a kernel's Packer ---------------------------------------------
 *
 * A Packer is the byte layout of one kernel's parameters (their kind, size and offset, which the
 * Python path computes once: _kernel._fast_layout). Packer.issue(stream, launch) queues a
 * KernelLaunch whose values the kernel's converters already checked and converted (Kernel.launch
 * decides everything; nothing here does): the values packed on the C stack and cuLaunchKernel
 * called, as the backend's launch() packs them with struct and calls it. A value that does not
 * pack, or a driver error, goes to that launch() (the fallback), which raises.
 */
#include <structmember.h>

static PyObject *str_handle; /* a loaded function's "handle" */

#define MAX_PARAMS 64
#define MAX_BYTES 4096

typedef struct {
    char kind;  /* 'p' pointer, 'i' signed, 'u' unsigned, 'f' float, 'b' bool */
    int size;   /* bytes */
    Py_ssize_t offset;
} param_t;

typedef struct {
    PyObject_HEAD
    PyObject *fallback; /* the backend's launch(stream, KernelLaunch) */
    /* the last function, grid and block objects seen and what they read as (a hot loop launches
       one kernel on one device with the same dimension tuples: normalize_dims keeps them) */
    PyObject *function, *grid, *block;
    uintptr_t function_address;
    unsigned grid_dims[3], block_dims[3];
    Py_ssize_t n;
    param_t params[MAX_PARAMS];
} Packer;

static const unsigned long GRID[3] = {2147483647ul, 65535ul, 65535ul}, BLOCK[3] = {1024ul, 1024ul, 64ul};

/* A grid or block given as an exact int or a tuple of 1-3 exact ints within CUDA's limits. */
static int dims(PyObject *o, const unsigned long lim[3], unsigned out[3]) {
    out[0] = out[1] = out[2] = 1;
    Py_ssize_t n = 1;
    PyObject *const *items = &o;
    if (!PyLong_CheckExact(o)) {
        if (!PyTuple_CheckExact(o) || PyTuple_GET_SIZE(o) < 1 || PyTuple_GET_SIZE(o) > 3) return -1;
        n = PyTuple_GET_SIZE(o);
        items = &PyTuple_GET_ITEM(o, 0);
    }
    for (Py_ssize_t i = 0; i < n; ++i) {
        if (!PyLong_CheckExact(items[i])) return -1;
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(items[i], &overflow);
        if (overflow || v < 1 || (unsigned long long)v > lim[i]) return -1;
        out[i] = (unsigned)v;
    }
    return 0;
}

/* One converted value into its slot: a pointer or an integer as an exact int (a bool too, as the
   converters return it), a float as a float or an int. 0, or -1 with an exception (TypeError,
   OverflowError) for a value the converters would not have returned. */
static int pack(const param_t *p, PyObject *v, unsigned char *dst) {
    if (p->kind == 'f') {
        double d = PyFloat_CheckExact(v) ? PyFloat_AS_DOUBLE(v) : PyLong_CheckExact(v) ? PyLong_AsDouble(v) : -1.0;
        if (!PyFloat_CheckExact(v) && !PyLong_CheckExact(v)) {
            PyErr_Format(PyExc_TypeError, "a float parameter's value is a %.80s", Py_TYPE(v)->tp_name);
            return -1;
        }
        if (d == -1.0 && PyErr_Occurred()) return -1;
        if (p->size == 8) {
            memcpy(dst, &d, 8);
        } else {
            float f = (float)d;
            if (isinf(f) && !isinf(d)) {
                PyErr_SetString(PyExc_OverflowError, "a float32 parameter's value rounds to infinity");
                return -1;
            }
            memcpy(dst, &f, 4);
        }
        return 0;
    }
    if (!PyLong_Check(v)) {
        PyErr_Format(PyExc_TypeError, "an integer or pointer parameter's value is a %.80s", Py_TYPE(v)->tp_name);
        return -1;
    }
    if (p->kind == 'p' || p->kind == 'u' || p->kind == 'b') {
        /* (an address or an unsigned value the converters checked: in range, not negative; the
           mask reads it without the general conversion's byte array) */
        if (_PyLong_Sign(v) < 0) {
            PyErr_SetString(PyExc_OverflowError, "an unsigned parameter's value is negative");
            return -1;
        }
        unsigned long long u = PyLong_AsUnsignedLongLongMask(v);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        if (p->size == 8 && _PyLong_NumBits(v) > 64) {
            PyErr_SetString(PyExc_OverflowError, "an unsigned parameter's value does not fit its size");
            return -1;
        }
        if (p->size < 8 && u >> (8 * p->size)) {
            PyErr_SetString(PyExc_OverflowError, "an unsigned parameter's value does not fit its size");
            return -1;
        }
        memcpy(dst, &u, (size_t)p->size); /* little-endian: the low bytes */
        return 0;
    }
    int overflow;
    long long i = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (i == -1 && PyErr_Occurred()) return -1;
    long long lim = p->size < 8 ? 1LL << (8 * p->size - 1) : 0;
    if (overflow || (p->size < 8 && (i < -lim || i >= lim))) {
        PyErr_SetString(PyExc_OverflowError, "a signed parameter's value does not fit its size");
        return -1;
    }
    memcpy(dst, &i, (size_t)p->size);
    return 0;
}

/* The values (a tuple of the kernel's parameters' converted values) packed into buf, kp pointing
   at each: 0, or -1 with an exception. */
static int pack_values(const Packer *P, PyObject *values, unsigned char *buf, void **kp) {
    /* (a tuple, or the list the launch path converted them into) */
    PyObject **items = PyTuple_Check(values) ? &PyTuple_GET_ITEM(values, 0)
                       : PyList_Check(values) ? PySequence_Fast_ITEMS(values)
                                              : NULL;
    if (items == NULL || Py_SIZE(values) != P->n) {
        PyErr_Format(PyExc_TypeError, "a launch of %zd parameters with other values", P->n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < P->n; ++i) {
        kp[i] = buf + P->params[i].offset;
        if (pack(&P->params[i], items[i], kp[i])) return -1;
    }
    return 0;
}

/* Packer(layout, fallback): layout is one (kind, size, offset) per parameter; fallback is the
   backend's launch(stream, launch). */
static PyObject *packer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *layout, *fallback;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "Packer takes positional arguments only");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OO:Packer", &layout, &fallback)) return NULL;
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "Packer's fallback must be callable");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(layout, "Packer's layout must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > MAX_PARAMS) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "a Packer takes at most %d parameters, got %zd", MAX_PARAMS, n);
    }
    Packer *P = (Packer *)type->tp_alloc(type, 0);
    if (P == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; ++i) {
        param_t *p = &P->params[i];
        const char *kind;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "sin:layout", &kind, &p->size, &p->offset)) goto fail;
        p->kind = kind[0];
        P->n = i + 1;
        int sized = p->kind == 'p' ? p->size == 8
                    : p->kind == 'f' ? p->size == 4 || p->size == 8
                    : p->kind == 'b' ? p->size == 1
                    : (p->kind == 'i' || p->kind == 'u') &&
                          (p->size == 1 || p->size == 2 || p->size == 4 || p->size == 8);
        if (strlen(kind) != 1 || !sized || p->offset < 0 || p->offset + p->size > MAX_BYTES ||
            p->offset % p->size) {
            PyErr_Format(PyExc_ValueError, "parameter %zd: no packing for (%s, %d, %zd)", i, kind, p->size,
                         p->offset);
            goto fail;
        }
    }
    Py_DECREF(seq);
    P->fallback = Py_NewRef(fallback);
    return (PyObject *)P;
fail:
    Py_DECREF(seq);
    Py_DECREF(P);
    return NULL;
}

static int packer_traverse(Packer *P, visitproc visit, void *arg) {
    Py_VISIT(P->fallback);
    Py_VISIT(P->function);
    Py_VISIT(P->grid);
    Py_VISIT(P->block);
    return 0;
}

static int packer_clear(Packer *P) {
    Py_CLEAR(P->fallback);
    Py_CLEAR(P->function);
    Py_CLEAR(P->grid);
    Py_CLEAR(P->block);
    return 0;
}

static void packer_dealloc(Packer *P) {
    PyObject_GC_UnTrack(P);
    packer_clear(P);
    Py_TYPE(P)->tp_free((PyObject *)P);
}

/* The address of a raw stream (an int, or a cuda.bindings CUstream), the last one's kept: a hot
   loop queues on one stream, and converting a handle object is a call. (Held: its address cannot
   be another object's while it is kept.) */
static PyObject *last_stream;
static uintptr_t last_stream_address;

static int stream_address(PyObject *o, uintptr_t *out) {
    if (o == last_stream) {
        *out = last_stream_address;
        return 0;
    }
    if (as_address(o, out)) return -1;
    Py_XSETREF(last_stream, Py_NewRef(o));
    last_stream_address = *out;
    return 0;
}

/* A grid or block through the packer's last one: 0, or -1 when it does not read (no exception). */
static int packer_dims(PyObject **last, unsigned kept[3], PyObject *o, const unsigned long lim[3], unsigned out[3]) {
    if (o != *last) {
        if (dims(o, lim, kept)) return -1;
        Py_XSETREF(*last, Py_NewRef(o));
    }
    memcpy(out, kept, sizeof(unsigned[3]));
    return 0;
}

/* Queue a launch of the function at `function` over `grid` x `block` (3-tuples of ints), with
   `shared` bytes of shared memory, on the stream at `stream`, its `values` packed by P: the
   CUresult (0: queued), or CG_UNBOUND when it cannot be done here (nothing queued, no exception
   set: the caller's fallback does it), or CG_ERROR (an exception that is not an Exception, left
   set). */
static int packer_launch(Packer *P, uintptr_t function, PyObject *grid_obj, PyObject *block_obj, unsigned shared,
                         uintptr_t stream, PyObject *values) {
    void *fn = fns[LAUNCH]; /* (read with the GIL held: bind() may change it) */
    unsigned grid[3], block[3];
    if (fn == NULL) return CG_UNBOUND;
    if (packer_dims(&P->grid, P->grid_dims, grid_obj, GRID, grid) ||
        packer_dims(&P->block, P->block_dims, block_obj, BLOCK, block))
        return cleared() ? CG_ERROR : CG_UNBOUND;
    _Alignas(16) unsigned char buf[MAX_BYTES];
    void *kp[MAX_PARAMS];
    if (pack_values(P, values, buf, kp)) return cleared() ? CG_ERROR : CG_UNBOUND;
    CUresult err;
    Py_BEGIN_ALLOW_THREADS
    err = ((launch_t)fn)((handle)function, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared,
                         (handle)stream, P->n ? kp : NULL, NULL);
    Py_END_ALLOW_THREADS
    return err;
}

/* packer_launch of a KernelLaunch (function, grid, block, shared_mem, values, views). */
static int packer_launch_tuple(Packer *P, uintptr_t stream, PyObject *launch) {
    if (!PyTuple_Check(launch) || PyTuple_GET_SIZE(launch) != 6) return CG_UNBOUND;
    PyObject *shm = PyTuple_GET_ITEM(launch, 3), *function = PyTuple_GET_ITEM(launch, 0);
    unsigned long shared = PyLong_CheckExact(shm) ? PyLong_AsUnsignedLong(shm) : (unsigned long)-1;
    if ((shared == (unsigned long)-1 && PyErr_Occurred()) || shared > 0xFFFFFFFFul)
        return cleared() ? CG_ERROR : CG_UNBOUND;
    if (function != P->function) { /* (the loaded kernel's CUfunction: its handle) */
        PyObject *h = PyObject_GetAttr(function, str_handle);
        uintptr_t address;
        int bad = h == NULL || as_address(h, &address);
        Py_XDECREF(h);
        if (bad) return cleared() ? CG_ERROR : CG_UNBOUND;
        Py_XSETREF(P->function, Py_NewRef(function));
        P->function_address = address;
    }
    return packer_launch(P, P->function_address, PyTuple_GET_ITEM(launch, 1), PyTuple_GET_ITEM(launch, 2),
                         (unsigned)shared, stream, PyTuple_GET_ITEM(launch, 4));
}

/* issue(stream, launch): queue a KernelLaunch as the backend's launch() does; anything that does
   not pack, or a driver error, goes to that launch() (it raises the driver's error, or recovers a
   missing context). */
static PyObject *packer_issue(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Packer *P = (Packer *)self;
    if (nargs != 2 || P->fallback == NULL) {
        PyErr_SetString(PyExc_TypeError, "issue takes a stream and a KernelLaunch");
        return NULL;
    }
    uintptr_t stream;
    int err = stream_address(args[0], &stream) ? (cleared() ? CG_ERROR : CG_UNBOUND)
                                                 : packer_launch_tuple(P, stream, args[1]);
    if (err == 0) Py_RETURN_NONE;
    if (err == CG_ERROR) return NULL;
    return PyObject_Vectorcall(P->fallback, args, 2, NULL);
}

static PyMethodDef packer_methods[] = {
    {"issue", (PyCFunction)(void (*)(void))packer_issue, METH_FASTCALL,
     "issue(stream, launch): queue a checked KernelLaunch, as the backend's launch() does"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PackerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cudagraphs._fastcall.Packer",
    .tp_basicsize = sizeof(Packer),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Packer(layout, fallback): a kernel's argument layout; issue() queues its launches.",
    .tp_new = packer_new,
    .tp_dealloc = (destructor)packer_dealloc,
    .tp_traverse = (traverseproc)packer_traverse,
    .tp_clear = (inquiry)packer_clear,
    .tp_methods = packer_methods,
};

/* ---- Node updates: kernel nodes' parameters, packed by their Packer ---------------------------
 *
 * Graph.rebind (_node_changes, compiled) decides which nodes change and what their arguments
 * become; a kernel node whose kernel has a Packer it hands here (the API's nodes_new, nodes_add,
 * nodes_set): its new values packed as a launch of that kernel packs them, and the node set with
 * cuGraphExecKernelNodeSetParams, a batch of nodes to one release of the GIL. Nothing here
 * decides: what does not pack, or a node the driver refuses, the caller sets through the
 * backend's graph_update (which reports the driver's error).
 */

typedef struct { /* CUDA_KERNEL_NODE_PARAMS_v2 */
    handle func;
    unsigned grid[3], block[3], shared;
    void **params, **extra;
    handle kern, ctx;
} node_params_t;

#define NODES_MAX 64 /* the nodes a batch holds: set to one release of the GIL */

typedef struct { /* one node's new parameters, packed */
    _Alignas(16) unsigned char buf[MAX_BYTES];
    void *kp[MAX_PARAMS];
    node_params_t p;
    uintptr_t node;
} node_slot_t;

typedef struct {
    PyObject_HEAD
    uintptr_t exec;        /* the executable graph whose nodes are set */
    Py_ssize_t n, capacity; /* nodes added since the last set; room */
    node_slot_t *slots;
} Nodes;

static void nodes_dealloc(Nodes *B) {
    PyMem_Free(B->slots);
    Py_TYPE(B)->tp_free((PyObject *)B);
}

static PyTypeObject NodesType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cudagraphs._fastcall.Nodes",
    .tp_basicsize = sizeof(Nodes),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A batch of kernel nodes' new parameters (the API's nodes_new; not made from Python).",
    .tp_dealloc = (destructor)nodes_dealloc,
};

/* A batch for the executable graph at `exec`, room for `expected` nodes (at most NODES_MAX): a new
   reference, None where no cuGraphExecKernelNodeSetParams is bound, NULL with an exception. */
static PyObject *api_nodes_new(uintptr_t exec, Py_ssize_t expected) {
    if (fns[NODE_SET] == NULL) Py_RETURN_NONE;
    Py_ssize_t capacity = expected < 1 ? 1 : expected > NODES_MAX ? NODES_MAX : expected;
    Nodes *B = PyObject_New(Nodes, &NodesType);
    if (B == NULL) return NULL;
    B->exec = exec, B->n = 0, B->capacity = capacity;
    B->slots = PyMem_Malloc((size_t)capacity * sizeof(node_slot_t));
    if (B->slots == NULL) {
        Py_DECREF(B);
        return PyErr_NoMemory();
    }
    return (PyObject *)B;
}

/* Node `node`'s new parameters into the batch: the function at `function` over grid x block,
   `shared` bytes, `values` packed by the kernel's Packer. 0 added, 1 added and the batch full,
   CG_UNBOUND when not added (no exception set), CG_ERROR (an exception that is not an Exception,
   left set). */
static int api_nodes_add(PyObject *batch, PyObject *packer, uintptr_t node, uintptr_t function, PyObject *grid,
                         PyObject *block, unsigned shared, PyObject *values) {
    if (Py_TYPE(batch) != &NodesType || Py_TYPE(packer) != &PackerType || ((Packer *)packer)->fallback == NULL)
        return CG_UNBOUND;
    Nodes *B = (Nodes *)batch;
    Packer *P = (Packer *)packer;
    if (B->n >= B->capacity) return CG_UNBOUND;
    node_slot_t *s = &B->slots[B->n];
    memset(&s->p, 0, sizeof s->p);
    if (packer_dims(&P->grid, P->grid_dims, grid, GRID, s->p.grid) ||
        packer_dims(&P->block, P->block_dims, block, BLOCK, s->p.block) || pack_values(P, values, s->buf, s->kp))
        return cleared() ? CG_ERROR : CG_UNBOUND;
    s->p.func = (handle)function;
    s->p.shared = shared;
    s->p.params = P->n ? s->kp : NULL;
    s->node = node;
    return ++B->n == B->capacity;
}

/* cuGraphExecKernelNodeSetParams for each node added since the last set, in order, the GIL released
   once: how many it set before the driver refused one (all of them when none was refused; none
   when no entry point is bound). The batch is empty after. */
static Py_ssize_t api_nodes_set(PyObject *batch) {
    if (Py_TYPE(batch) != &NodesType) return 0;
    Nodes *B = (Nodes *)batch;
    Py_ssize_t n = B->n, done = 0;
    void *set = fns[NODE_SET]; /* (read with the GIL held: bind() may change it) */
    B->n = 0;
    if (set == NULL || n == 0) return 0;
    uintptr_t exec = B->exec;
    node_slot_t *slots = B->slots;
    Py_BEGIN_ALLOW_THREADS
    for (; done < n; ++done)
        if (((node_set_t)set)((handle)exec, (handle)slots[done].node, &slots[done].p) != 0) break;
    Py_END_ALLOW_THREADS
    return done;
}

/* ---- A lock C takes without a method call ------------------------------------------------------
 *
 * Lock is threading.Lock's subset the caching allocator uses (acquire(blocking, timeout),
 * release(), locked(), `with`), so that compiled code (api's lock_take, lock_give) takes it directly;
 * Lock(reentrant=True) is threading.RLock's (its owner takes it again; only the owner gives it
 * back), the graphed callable's. Whether it
 * is held is a flag that is read and set with the GIL held (the module runs with the GIL: it does
 * not declare itself free-threading safe), so taking and giving a free lock costs no system call
 * (a PyThread lock reads the clock on every acquire). A blocking acquire waits with the GIL
 * released, as threading.Lock's does: a timeout ends it, and so does an exception raised by a
 * signal's handler (Ctrl-C) while it waits.
 */
typedef struct {
    PyObject_HEAD
    PyThread_type_lock wake; /* locked while no release is waiting to be seen; waiters block on it */
    int held, waiters;       /* (read and changed with the GIL held only) */
    int reentrant;           /* an RLock: its owner takes it again, and only its owner gives it */
    unsigned long owner;     /* (reentrant) the holding thread */
    Py_ssize_t depth;        /* (reentrant) how many times the owner holds it */
} Lock;

static PyObject *lock_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"reentrant", NULL};
    int reentrant = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$p:Lock", kw, &reentrant)) return NULL;
    Lock *L = (Lock *)type->tp_alloc(type, 0);
    if (L == NULL) return NULL;
    L->reentrant = reentrant;
    if ((L->wake = PyThread_allocate_lock()) == NULL) {
        Py_DECREF(L);
        return PyErr_NoMemory();
    }
    PyThread_acquire_lock(L->wake, NOWAIT_LOCK);
    return (PyObject *)L;
}

static void lock_dealloc(Lock *L) {
    if (L->wake != NULL) {
        PyThread_acquire_lock(L->wake, NOWAIT_LOCK); /* (unlocked before it is freed) */
        PyThread_release_lock(L->wake);
        PyThread_free_lock(L->wake);
    }
    Py_TYPE(L)->tp_free((PyObject *)L);
}

static PyObject *monotonic; /* time.monotonic, for a timed wait that a signal interrupts */

/* Take the lock, waiting up to `timeout` seconds (< 0: no limit; blocking 0: no wait), with the
   GIL released; a signal's handler runs meanwhile, and its exception ends the wait. 1 taken, 0
   not, -1 error. The lock's state is a flag changed under the GIL (no system call when free);
   a waiter sleeps on `wake`, which a release posts while anyone waits, and looks again. */
static int lock_take(Lock *L, int blocking, double timeout) {
    unsigned long me = L->reentrant ? PyThread_get_thread_ident() : 0;
    if (!L->held) {
        L->held = 1, L->owner = me, L->depth = 1;
        return 1;
    }
    if (L->reentrant && L->owner == me) {
        L->depth++;
        return 1;
    }
    if (!blocking || timeout == 0) return 0;
    double deadline = 0;
    if (timeout > 0) {
        if (monotonic == NULL) {
            PyObject *time = PyImport_ImportModule("time");
            monotonic = time == NULL ? NULL : PyObject_GetAttrString(time, "monotonic");
            Py_XDECREF(time);
            if (monotonic == NULL) return -1;
        }
        PyObject *t = PyObject_CallNoArgs(monotonic);
        if (t == NULL) return -1;
        deadline = PyFloat_AsDouble(t) + timeout;
        Py_DECREF(t);
    }
    int out = -1;
    L->waiters++;
    for (PY_TIMEOUT_T wait = timeout < 0 ? -1 : (PY_TIMEOUT_T)(timeout * 1e6);;) {
        PyLockStatus got;
        Py_BEGIN_ALLOW_THREADS
        got = PyThread_acquire_lock_timed(L->wake, wait, 1);
        Py_END_ALLOW_THREADS
        if (!L->held) { /* (released meanwhile: ours, whatever woke us) */
            L->held = 1, L->owner = me, L->depth = 1;
            out = 1;
            break;
        }
        if (got == PY_LOCK_FAILURE && timeout >= 0) {
            out = 0;
            break;
        }
        if (got == PY_LOCK_INTR && Py_MakePendingCalls() < 0) break; /* a handler raised */
        if (timeout > 0) {
            PyObject *t = PyObject_CallNoArgs(monotonic);
            if (t == NULL) break;
            double left = deadline - PyFloat_AsDouble(t);
            Py_DECREF(t);
            if (left <= 0) {
                out = 0;
                break;
            }
            wait = (PY_TIMEOUT_T)(left * 1e6);
        }
    }
    L->waiters--;
    return out;
}

static int lock_give(Lock *L) {
    if (L->reentrant && (!L->held || L->owner != PyThread_get_thread_ident())) {
        PyErr_SetString(PyExc_RuntimeError, "cannot release un-acquired lock");
        return -1;
    }
    if (!L->held) {
        PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
        return -1;
    }
    if (L->reentrant && --L->depth > 0) return 0;
    L->held = 0;
    if (L->waiters) PyThread_release_lock(L->wake); /* (one waiter wakes and takes it) */
    return 0;
}

static PyObject *lock_acquire(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"blocking", "timeout", NULL};
    int blocking = 1;
    double timeout = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|pd:acquire", kw, &blocking, &timeout)) return NULL;
    if (timeout < 0 && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "timeout value must be a non-negative number, or -1 for no limit");
        return NULL;
    }
    if (!blocking && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "can't specify a timeout for a non-blocking call");
        return NULL;
    }
    if (timeout > (double)PY_TIMEOUT_MAX / 1e6) {
        PyErr_SetString(PyExc_OverflowError, "timeout value is too large");
        return NULL;
    }
    int got = lock_take((Lock *)self, blocking, timeout);
    return got < 0 ? NULL : PyBool_FromLong(got);
}

static PyObject *lock_release(PyObject *self, PyObject *unused) {
    if (lock_give((Lock *)self)) return NULL;
    Py_RETURN_NONE;
}

static PyObject *lock_enter(PyObject *self, PyObject *unused) {
    if (lock_take((Lock *)self, 1, -1) < 0) return NULL;
    Py_RETURN_TRUE;
}

static PyObject *lock_exit(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (lock_give((Lock *)self)) return NULL;
    Py_RETURN_NONE;
}

static PyObject *lock_locked(PyObject *self, PyObject *unused) { return PyBool_FromLong(((Lock *)self)->held); }

static PyMethodDef lock_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))lock_acquire, METH_VARARGS | METH_KEYWORDS,
     "acquire(blocking=True, timeout=-1): take the lock, waiting up to timeout seconds (-1: no\n"
     "limit); False if it was not taken. A signal's handler runs while it waits."},
    {"release", lock_release, METH_NOARGS, "release(): give the lock back"},
    {"locked", lock_locked, METH_NOARGS, "locked(): whether the lock is taken"},
    {"__enter__", lock_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))lock_exit, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LockType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cudagraphs._fastcall.Lock",
    .tp_doc = "Lock(*, reentrant=False): a lock as threading.Lock (threading.RLock if reentrant), that C\n"
              "code takes without a method call.",
    .tp_basicsize = sizeof(Lock),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = lock_new,
    .tp_dealloc = (destructor)lock_dealloc,
    .tp_methods = lock_methods,
};

/* cuGraphLaunch(exec, stream) for compiled code: the CUresult, or CG_UNBOUND. */
static int api_graph_launch(uintptr_t exec, uintptr_t stream) {
    void *fn = fns[GRAPH_LAUNCH]; /* (read with the GIL held: bind() may change it) */
    if (fn == NULL) return CG_UNBOUND;
    CUresult err;
    Py_BEGIN_ALLOW_THREADS
    err = ((graph_launch_t)fn)((handle)exec, (handle)stream);
    Py_END_ALLOW_THREADS
    return err;
}

/* A piece of work's issue(stream, arg) made in C where `issue` is a Packer's issue method: the
   CUresult (0: queued), else CG_UNBOUND (the caller calls issue itself, which also reports a
   driver error) or CG_ERROR (an exception that is not an Exception, left set). */
static int api_issue(PyObject *issue, uintptr_t stream, PyObject *arg) {
    if (!PyCFunction_Check(issue) || ((PyCFunctionObject *)issue)->m_ml != &packer_methods[0]) return CG_UNBOUND;
    PyObject *self = PyCFunction_GET_SELF(issue);
    if (self == NULL || Py_TYPE(self) != &PackerType || ((Packer *)self)->fallback == NULL) return CG_UNBOUND;
    return packer_launch_tuple((Packer *)self, stream, arg);
}

/* A kernel's launch through its Packer, its values converted (see packer_launch). */
static int api_launch(PyObject *packer, uintptr_t function, PyObject *grid, PyObject *block, unsigned shared,
                      uintptr_t stream, PyObject *values) {
    if (Py_TYPE(packer) != &PackerType || ((Packer *)packer)->fallback == NULL) return CG_UNBOUND;
    return packer_launch((Packer *)packer, function, grid, block, shared, stream, values);
}

static int api_take(PyObject *lock, int blocking, double timeout) { return lock_take((Lock *)lock, blocking, timeout); }
static int api_give(PyObject *lock) { return lock_give((Lock *)lock); }

/* What compiled modules call (_fastcall_api.h; the capsule `api`). */
static cg_api_t api = {
    .version = CG_API_VERSION,
    .lock_type = &LockType,
    .lock_take = api_take,
    .lock_give = api_give,
    .graph_launch = api_graph_launch,
    .issue = api_issue,
    .launch = api_launch,
    .nodes_new = api_nodes_new,
    .nodes_add = api_nodes_add,
    .nodes_set = api_nodes_set,
};

/* bind(name, address): the driver entry point to call for `name` (0 unbinds). */
static PyObject *bind(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uintptr_t address;
    if (nargs != 2 || !PyUnicode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "bind takes a driver function name and its address");
        return NULL;
    }
    if (as_address(args[1], &address)) return NULL;
    const char *name = PyUnicode_AsUTF8(args[0]);
    if (name == NULL) return NULL;
    for (int i = 0; i < COUNT; ++i) {
        if (strcmp(name, NAMES[i]) == 0) {
            fns[i] = (void *)address;
            Py_RETURN_NONE;
        }
    }
    PyErr_Format(PyExc_ValueError, "no fast call for %s", name);
    return NULL;
}

/* bound(name): the address bind() gave `name` (0: none). */
static PyObject *bound(PyObject *self, PyObject *name) {
    const char *s = PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
    if (s == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "bound takes a driver function name");
        return NULL;
    }
    for (int i = 0; i < COUNT; ++i)
        if (strcmp(s, NAMES[i]) == 0) return PyLong_FromVoidPtr(fns[i]);
    PyErr_Format(PyExc_ValueError, "no fast call for %s", s);
    return NULL;
}

static PyObject *names(PyObject *self, PyObject *unused) {
    PyObject *out = PyTuple_New(COUNT);
    if (out == NULL) return NULL;
    for (int i = 0; i < COUNT; ++i) {
        PyObject *s = PyUnicode_FromString(NAMES[i]);
        if (s == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, s);
    }
    return out;
}

/* Callbacks other libraries call from C at any moment: a DLPack tensor's deleter, a capsule's
 * destructor. They run when the other library drops its last reference, which may be while an
 * exception is being raised in that thread (a failing capture unwinding through compiled code):
 * a ctypes callback would then run Python with that exception set (a SystemError, and the
 * exception lost). Each C callback here takes the GIL, sets the pending exception aside, calls the
 * Python function bound to it with the address it was given, and restores the exception; what the
 * function does is decided in Python (_dlpack). */
enum { CB_DELETER, CB_DESTRUCTOR, CB_COUNT };
static PyObject *callbacks[CB_COUNT];

static void call_aside(int which, void *address) {
    PyGILState_STATE gil = PyGILState_Ensure();
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *pending = PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
#endif
    PyObject *fn = callbacks[which];
    if (fn != NULL) {
        PyObject *arg = PyLong_FromVoidPtr(address);
        PyObject *r = arg != NULL ? PyObject_CallOneArg(fn, arg) : NULL;
        Py_XDECREF(arg);
        if (r == NULL)
            PyErr_WriteUnraisable(fn);
        else
            Py_DECREF(r);
    }
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(pending);
#else
    PyErr_Restore(type, value, tb);
#endif
    PyGILState_Release(gil);
}

static void dlpack_deleter(void *managed) { call_aside(CB_DELETER, managed); }
static void capsule_destructor(PyObject *capsule) { call_aside(CB_DESTRUCTOR, capsule); }

/* dlpack_callbacks(deleter, destructor): bind the Python functions; the C callbacks' addresses. */
static PyObject *dlpack_callbacks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyCallable_Check(args[0]) || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "dlpack_callbacks takes two callables");
        return NULL;
    }
    for (int i = 0; i < CB_COUNT; ++i) {
        Py_INCREF(args[i]);
        Py_XSETREF(callbacks[i], args[i]);
    }
    return Py_BuildValue("(NN)", PyLong_FromVoidPtr((void *)dlpack_deleter),
                         PyLong_FromVoidPtr((void *)capsule_destructor));
}

static PyMethodDef methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL, "bind(name, address)"},
    {"dlpack_callbacks", (PyCFunction)(void (*)(void))dlpack_callbacks, METH_FASTCALL,
     "dlpack_callbacks(deleter, destructor): the addresses of C callbacks that call them, any\n"
     "exception pending in the calling thread set aside (a DLPack deleter, a capsule destructor)"},
    {"bound", bound, METH_O, "bound(name): the address bound to name (0: none)."},
    {"names", names, METH_NOARGS, "The driver functions this module calls, in bind() names."},
    {"cuLaunchKernel", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, NULL},
    {"cuGraphLaunch", (PyCFunction)(void (*)(void))graph_launch, METH_FASTCALL, NULL},
    {"cuMemcpyDtoDAsync", (PyCFunction)(void (*)(void))copy_dd, METH_FASTCALL, NULL},
    {"cuMemcpyHtoDAsync", (PyCFunction)(void (*)(void))copy_hd, METH_FASTCALL, NULL},
    {"cuMemcpyDtoHAsync", (PyCFunction)(void (*)(void))copy_dh, METH_FASTCALL, NULL},
    {"cuMemsetD8Async", (PyCFunction)(void (*)(void))memset_d8, METH_FASTCALL, NULL},
    {"cuMemAllocFromPoolAsync", (PyCFunction)(void (*)(void))alloc, METH_FASTCALL, NULL},
    {"cuMemFreeAsync", (PyCFunction)(void (*)(void))mem_free, METH_FASTCALL, NULL},
    {"cuEventRecord", (PyCFunction)(void (*)(void))event_record, METH_FASTCALL, NULL},
    {"cuStreamWaitEvent", (PyCFunction)(void (*)(void))wait_event, METH_FASTCALL, NULL},
    {"cuGraphExecKernelNodeSetParams", (PyCFunction)(void (*)(void))node_set, METH_FASTCALL, NULL},
    {"cuGraphExecMemcpyNodeSetParams", (PyCFunction)(void (*)(void))copy_node_set, METH_FASTCALL,
     "cuGraphExecMemcpyNodeSetParams(exec, node, dst, src, nbytes): a 1-D device-to-device copy node"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "cudagraphs._fastcall",
    "The hot paths' driver calls at C's cost (optional; see the C source).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastcall(void) {
    if (PyType_Ready(&PackerType) < 0 || PyType_Ready(&LockType) < 0 || PyType_Ready(&NodesType) < 0)
        return NULL;
    if ((str_handle = PyUnicode_InternFromString("handle")) == NULL) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Packer", (PyObject *)&PackerType) < 0 ||
        PyModule_AddObjectRef(m, "Lock", (PyObject *)&LockType) < 0 ||
        PyModule_AddObject(m, "api", PyCapsule_New(&api, CG_API_CAPSULE, NULL)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
