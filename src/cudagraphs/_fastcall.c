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

/* ---- Launcher: the repeat path of Kernel.launch, checks included ------------------------
 *
 * A Launcher is the launch plan of one kernel: the byte layout of its parameters, what each
 * must be (an array of a given dtype on the launch's device, dense; an integer in range; a
 * number), and the kernel's CUfunction per device. Called with Kernel.launch's arguments, it
 * makes every check Kernel.launch makes, packs the arguments on the C stack and calls
 * cuLaunchKernel. Whatever it does not decide for sure (another type, a stream being captured,
 * a closed stream, a value out of range, a driver error) it hands to the Python path, `slow`,
 * unchanged: that path is the reference, raises the errors, and records captured work.
 * configure() names the classes it reads (their __slots__, at fixed offsets).
 */
#include <structmember.h>

#define MAX_PARAMS 64
#define MAX_BYTES 4096

static PyTypeObject *array_base;  /* cudagraphs.DeviceArray */
static PyTypeObject *stream_type; /* cudagraphs.Stream */
static PyObject *current_var;     /* the ContextVar of the current streams (a tuple) */
/* weakref.finalize and its registry of live finalizers (`alive` is membership there), read in C
   where they are as CPython 3.10-3.13 define them; else `alive` is asked */
static PyTypeObject *finalize_type;
static PyObject *finalize_registry;
static PyObject *plain_types;     /* {type: bool}: whether its instances read as plain arrays */
static Py_ssize_t a_ptr, a_device, a_dtype, a_contig, s_device, s_handle, s_recording, s_finalizer;
static Py_ssize_t a_shape = -1, a_size = -1, a_block = -1, a_arg = -1;
static PyObject *str_stream, *str_shared_mem, *str_alive, *str_handle, *str_fast, *str_out;
/* what records a captured launch in C (configure_capture): the Recording, NodeRecord and
   KernelLaunch classes, and the names read from a Recording, a block and a kernel */
static PyTypeObject *recording_type, *node_type, *launch_type;
static PyObject *str_thread, *str_invalid, *str_frees, *str_memory, *str_owners, *str_keep, *str_nodes,
    *str_owner, *str_name, *str_view_spec, *str_kernel;

#define SLOT(o, offset) (*(PyObject **)((char *)(o) + (offset)))

static Py_ssize_t slot_offset(PyTypeObject *t, const char *name) {
    PyObject *key = PyUnicode_InternFromString(name);
    if (key == NULL) return -1;
    PyObject *d = _PyType_Lookup(t, key);
    Py_DECREF(key);
    if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type) ||
        ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX) {
        PyErr_Format(PyExc_TypeError, "%.80s.%s is not a __slots__ attribute", t->tp_name, name);
        return -1;
    }
    return ((PyMemberDescrObject *)d)->d_member->offset;
}

/* The offset of field `name` of the array or stream class: from the offsets its compiled module
   gave (configure's fourth and fifth arguments: an extension type's fields are no __slots__), else
   its slot. */
static PyObject *array_offsets, *stream_offsets; /* {name: offset}, or NULL */

static Py_ssize_t field_at(PyObject *offsets, PyTypeObject *t, const char *name) {
    if (offsets == NULL) return slot_offset(t, name);
    PyObject *v = PyDict_GetItemString(offsets, name);
    Py_ssize_t offset = v == NULL ? -1 : PyLong_AsSsize_t(v);
    if (offset < (Py_ssize_t)sizeof(PyObject)) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_TypeError, "no offset given for %.80s.%s", t->tp_name, name);
        return -1;
    }
    return offset;
}

static Py_ssize_t array_field(PyTypeObject *t, const char *name) { return field_at(array_offsets, t, name); }

/* configure(array_type, stream_type, current_streams): the classes Launchers read. */
static PyObject *configure(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyType_Check(args[0]) || !PyType_Check(args[1]) ||
        (args[3] != Py_None && !PyDict_CheckExact(args[3])) || (args[4] != Py_None && !PyDict_CheckExact(args[4]))) {
        PyErr_SetString(PyExc_TypeError,
                        "configure takes the array class, the stream class, a ContextVar and the array's and the "
                        "stream's field offsets (None: their __slots__)");
        return NULL;
    }
    Py_XSETREF(array_offsets, args[3] == Py_None ? NULL : Py_NewRef(args[3]));
    Py_XSETREF(stream_offsets, args[4] == Py_None ? NULL : Py_NewRef(args[4]));
    if (!PyContextVar_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "configure's third argument must be a ContextVar");
        return NULL;
    }
    PyTypeObject *at = (PyTypeObject *)args[0], *st = (PyTypeObject *)args[1];
    Py_ssize_t o[10];
    const char *an[4] = {"_ptr", "device", "dtype", "is_contiguous"};
    const char *sn[4] = {"device", "handle", "_recording", "_finalizer"};
    for (int i = 0; i < 4; ++i)
        if ((o[i] = array_field(at, an[i])) < 0 || (o[4 + i] = field_at(stream_offsets, st, sn[i])) < 0) return NULL;
    if ((o[8] = array_field(at, "shape")) < 0 || (o[9] = array_field(at, "size")) < 0) return NULL;
    PyObject *known = PyDict_New();
    if (known == NULL) return NULL;
    a_shape = o[8], a_size = o[9];
    a_block = a_arg = -1; /* (configure_capture again: read from this class) */
    a_ptr = o[0], a_device = o[1], a_dtype = o[2], a_contig = o[3];
    s_device = o[4], s_handle = o[5], s_recording = o[6], s_finalizer = o[7];
    PyObject *weakref = PyImport_ImportModule("weakref");
    PyObject *fin = weakref == NULL ? NULL : PyObject_GetAttrString(weakref, "finalize");
    PyObject *registry = fin == NULL ? NULL : PyObject_GetAttrString(fin, "_registry");
    Py_XDECREF(weakref);
    if (registry != NULL && PyDict_CheckExact(registry) && PyType_Check(fin)) {
        Py_XSETREF(finalize_type, (PyTypeObject *)Py_NewRef(fin));
        Py_XSETREF(finalize_registry, Py_NewRef(registry));
    }
    Py_XDECREF(fin);
    Py_XDECREF(registry);
    if (cleared()) {
        Py_DECREF(known);
        return NULL;
    }
    Py_INCREF(at), Py_INCREF(st), Py_INCREF(args[2]);
    Py_XSETREF(array_base, at);
    Py_XSETREF(stream_type, st);
    Py_XSETREF(current_var, args[2]);
    Py_XSETREF(plain_types, known);
    Py_RETURN_NONE;
}

/* configure_capture(Recording, NodeRecord, KernelLaunch): launches on a stream captured by a
   Recording are recorded in C (see record_here) by Launchers whose plan names the function
   object. Needs configure() first (the array class's _block and _arg slots). */
static PyObject *configure_capture(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyType_Check(args[0]) || !PyType_Check(args[1]) || !PyType_Check(args[2]) ||
        array_base == NULL) {
        PyErr_SetString(PyExc_TypeError,
                        "configure_capture takes the Recording, NodeRecord and KernelLaunch classes (configure first)");
        return NULL;
    }
    if (!PyType_IsSubtype((PyTypeObject *)args[1], &PyTuple_Type) ||
        !PyType_IsSubtype((PyTypeObject *)args[2], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "NodeRecord and KernelLaunch must be tuple classes");
        return NULL;
    }
    Py_ssize_t block = array_field(array_base, "_block"), arg = array_field(array_base, "_arg");
    if (block < 0 || arg < 0) return NULL;
    a_block = block, a_arg = arg;
    Py_INCREF(args[0]), Py_INCREF(args[1]), Py_INCREF(args[2]);
    Py_XSETREF(recording_type, (PyTypeObject *)args[0]);
    Py_XSETREF(node_type, (PyTypeObject *)args[1]);
    Py_XSETREF(launch_type, (PyTypeObject *)args[2]);
    Py_RETURN_NONE;
}

/* Whether instances of t read as plain arrays: the base class, or a subclass that overrides
   none of what a launch reads (a graph output's own check lives in its _view_spec). */
static int is_plain(PyTypeObject *t) {
    if (t == array_base) return 1;
    if (!PyType_IsSubtype(t, array_base)) return 0;
    /* an answer holds while the class is unchanged: its version tag moves when an attribute of
       it or of a base is set (a _view_spec assigned later is seen) */
    int tagged = PyType_HasFeature(t, Py_TPFLAGS_VALID_VERSION_TAG);
    unsigned long tag = t->tp_version_tag;
    PyObject *known = tagged ? PyDict_GetItemWithError(plain_types, (PyObject *)t) : NULL;
    if (known != NULL && PyLong_CheckExact(known)) {
        unsigned long long v = PyLong_AsUnsignedLongLong(known);
        if ((v >> 1) == tag) return (int)(v & 1);
    }
    if (PyErr_Occurred()) return -1;
    static const char *names[] = {"ptr",  "device", "dtype",          "is_contiguous", "_view_spec",
                                  "_arg", "_block", "__getattribute__", "__getattr__"};
    int plain = 1;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && plain; ++i) {
        PyObject *key = PyUnicode_InternFromString(names[i]);
        if (key == NULL) return -1;
        plain = _PyType_Lookup(t, key) == _PyType_Lookup(array_base, key);
        Py_DECREF(key);
    }
    if (tagged && t->tp_version_tag == tag) {
        if (PyDict_GET_SIZE(plain_types) >= 256) PyDict_Clear(plain_types); /* (classes made on the fly) */
        PyObject *v = PyLong_FromUnsignedLongLong(((unsigned long long)tag << 1) | (unsigned)plain);
        if (v == NULL || PyDict_SetItem(plain_types, (PyObject *)t, v)) {
            Py_XDECREF(v);
            return -1;
        }
        Py_DECREF(v);
    }
    return plain;
}

typedef struct {
    char kind;        /* 'p' pointer, 'i' signed, 'u' unsigned, 'f' float, 'b' bool */
    int size;         /* bytes */
    Py_ssize_t offset;
    PyObject *pointee; /* the dtype a pointer's array must have (NULL: any) */
} param_t;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *slow;    /* the Python path: the bound Kernel.launch */
    PyObject *record;  /* what records a checked launch on a captured stream: Kernel.enqueue */
    PyObject *issue;   /* the backend's launch(stream, KernelLaunch): what issue() falls back on */
    PyObject *devices; /* {Device: (CUfunction address, default stream)} */
    PyObject *grid, *block; /* the (x, y, z) tuples of the last recorded launch */
    Py_ssize_t n;
    unsigned long long fast, handed; /* launches made here, calls handed to `slow` */
    param_t params[MAX_PARAMS];
} Launcher;

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

/* One argument into its slot, or -1: the Python path decides (no exception is left set).
   With `value`, also the value the Python path's converter returns (a new reference). */
static int pack(const param_t *p, PyObject *a, PyObject *device, unsigned char *dst, PyObject **value) {
    PyObject *out = a; /* (the converters return ints and floats as given) */
    if (p->kind == 'p') {
        unsigned long long v;
        if (a == Py_None) {
            v = 0;
        } else {
            if (!PyLong_CheckExact(a)) {
                int plain = is_plain(Py_TYPE(a));
                if (plain <= 0 || SLOT(a, a_device) != device || SLOT(a, a_contig) != Py_True ||
                    (p->pointee != NULL && SLOT(a, a_dtype) != p->pointee))
                    goto hand;
                a = out = SLOT(a, a_ptr);
                if (a == NULL || !PyLong_CheckExact(a)) goto hand;
            }
            v = PyLong_AsUnsignedLongLong(a);
            if (v == (unsigned long long)-1 && PyErr_Occurred()) goto hand;
        }
        memcpy(dst, &v, 8);
        if (value != NULL) *value = a == Py_None ? PyLong_FromLong(0) : Py_NewRef(out);
        return value != NULL && *value == NULL ? -1 : 0;
    }
    if (p->kind == 'f') {
        double d;
        if (PyFloat_CheckExact(a)) {
            d = PyFloat_AS_DOUBLE(a);
        } else if (PyLong_CheckExact(a)) {
            d = PyLong_AsDouble(a);
            if (d == -1.0 && PyErr_Occurred()) goto hand;
            out = NULL;
        } else {
            goto hand;
        }
        if (p->size == 8) {
            memcpy(dst, &d, 8);
        } else {
            float f = (float)d;
            if (isinf(f) && !isinf(d)) goto hand; /* struct's 'f' refuses it */
            memcpy(dst, &f, 4);
        }
        if (value != NULL) *value = out != NULL ? Py_NewRef(out) : PyFloat_FromDouble(d);
        return value != NULL && *value == NULL ? -1 : 0;
    }
    if (p->kind == 'b') {
        unsigned char b;
        if (a == Py_True || a == Py_False) b = a == Py_True;
        else if (PyLong_CheckExact(a)) b = PyObject_IsTrue(a);
        else goto hand;
        *dst = b;
        if (value != NULL) *value = PyBool_FromLong(b);
        return 0;
    }
    if (!PyLong_CheckExact(a)) goto hand; /* bools, numpy integers: the Python path */
    if (p->kind == 'u') {
        unsigned long long v = PyLong_AsUnsignedLongLong(a);
        if (v == (unsigned long long)-1 && PyErr_Occurred()) goto hand;
        if (p->size < 8 && v >> (8 * p->size)) goto hand;
        memcpy(dst, &v, (size_t)p->size); /* little-endian: the low bytes */
    } else {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(a, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred())) goto hand;
        if (p->size < 8) {
            long long lim = 1LL << (8 * p->size - 1);
            if (v < -lim || v >= lim) goto hand;
        }
        memcpy(dst, &v, (size_t)p->size);
    }
    if (value != NULL) *value = Py_NewRef(a);
    return 0;
hand:
    PyErr_Clear();
    return -1;
}

/* A tuple of `type` (a NamedTuple) from n items, as tuple.__new__(type, items) makes it. */
static PyObject *tuple_of(PyTypeObject *type, PyObject *items) {
    PyObject *args = PyTuple_Pack(1, items);
    if (args == NULL) return NULL;
    PyObject *out = PyTuple_Type.tp_new(type, args, NULL);
    Py_DECREF(args);
    return out;
}

/* The same from 6 items, without the temporary tuples (per recorded launch and patched node):
   a subclass of tuple with no fields of its own (a NamedTuple) is allocated and filled as
   tuple.__new__ fills it; any other type goes through tuple_of. */
static PyObject *tuple6(PyTypeObject *type, PyObject *a, PyObject *b, PyObject *c, PyObject *d, PyObject *e,
                        PyObject *f) {
    PyObject *items[6] = {a, b, c, d, e, f};
    if (type->tp_basicsize != PyTuple_Type.tp_basicsize || type->tp_itemsize != PyTuple_Type.tp_itemsize ||
        type->tp_dictoffset != 0 || !PyType_IsSubtype(type, &PyTuple_Type)) {
        PyObject *packed = PyTuple_Pack(6, a, b, c, d, e, f);
        if (packed == NULL) return NULL;
        PyObject *out = tuple_of(type, packed);
        Py_DECREF(packed);
        return out;
    }
    PyObject *out = type->tp_alloc(type, 6);
    if (out == NULL) return NULL;
    for (int i = 0; i < 6; ++i) PyTuple_SET_ITEM(out, i, Py_NewRef(items[i]));
    return out;
}

/* A grid or block as a 3-tuple of ints, the one made last time when it is the same. */
static PyObject *dims_tuple(PyObject **cache, const unsigned v[3]) {
    PyObject *t = *cache;
    if (t != NULL) {
        int same = 1;
        for (int i = 0; i < 3 && same; ++i) same = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(t, i)) == v[i];
        if (same) return Py_NewRef(t);
        PyErr_Clear();
    }
    t = Py_BuildValue("(III)", v[0], v[1], v[2]);
    if (t != NULL) Py_XSETREF(*cache, Py_NewRef(t));
    return t;
}

/* The common captured launch, recorded here as Kernel.enqueue and Recording.record would: on the
   stream the Recording `rec` captures (not a conditional body), from its thread, with no
   capture error and no graph memory waiting to be freed, arguments the launch path packs. The
   launch is queued (cuLaunchKernel on the captured stream); the arrays whose memory the capture
   does not own go to rec.keep and the node's NodeRecord(None, "kernel", name, (), (kernel,
   KernelLaunch), True) to rec.nodes. Returns 1 when recorded, 0 when the Python path must do it
   (nothing was queued or recorded, no exception is set), -1 on an error (set). */
static int record_here(Launcher *L, PyObject *const *argv, PyObject *device, PyObject *stream, PyObject *rec,
                       PyObject *fnobj, uintptr_t function, uintptr_t raw_stream, const unsigned grid[3],
                       const unsigned block[3], unsigned long long shared) {
    if (recording_type == NULL || Py_TYPE(rec) != recording_type || fnobj == NULL || a_block < 0 ||
        !PyMethod_Check(L->slow))
        return 0;
    PyObject *d = PyObject_GenericGetDict(rec, NULL);
    if (d == NULL) {
        PyErr_Clear();
        return 0;
    }
    int done = 0;
    PyObject *keep = NULL, *nodes = NULL, *owners = NULL, *name = NULL, *values = NULL, *views = NULL;
    PyObject *kept = NULL, *g = NULL, *b = NULL, *sh = NULL, *launch = NULL, *patch = NULL;
    PyObject *node = NULL, *empty = NULL;
    /* (read before any Python code runs; only `memory` is used after, and held) */
    PyObject *thread = PyDict_GetItemWithError(d, str_thread), *invalid = PyDict_GetItemWithError(d, str_invalid);
    PyObject *frees = PyDict_GetItemWithError(d, str_frees), *top = PyDict_GetItemWithError(d, str_stream);
    PyObject *memory = Py_XNewRef(PyDict_GetItemWithError(d, str_memory));
    keep = Py_XNewRef(PyDict_GetItemWithError(d, str_keep));
    nodes = Py_XNewRef(PyDict_GetItemWithError(d, str_nodes));
    if (thread == NULL || invalid != Py_None || frees == NULL || top != stream || memory == NULL || keep == NULL ||
        nodes == NULL || !PyList_CheckExact(keep) || !PyList_CheckExact(nodes) || !PyLong_CheckExact(thread))
        goto out;
    unsigned long me = PyLong_AsUnsignedLong(thread);
    if ((me == (unsigned long)-1 && PyErr_Occurred()) || me != PyThread_get_thread_ident()) goto out;
    if (PyObject_Size(frees) != 0) goto out; /* (the Python path records their free nodes first) */
    PyObject *kernel = PyMethod_GET_SELF(L->slow);
    if ((owners = PyObject_GetAttr(memory, str_owners)) == NULL || (name = PyObject_GetAttr(kernel, str_name)) == NULL ||
        !PyTuple_CheckExact(owners) || !PyUnicode_CheckExact(name))
        goto out;
    if ((values = PyTuple_New(L->n)) == NULL || (views = PyTuple_New(L->n)) == NULL || (kept = PyList_New(0)) == NULL)
        goto out;
    _Alignas(16) unsigned char buf[MAX_BYTES];
    void *kp[MAX_PARAMS];
    for (Py_ssize_t i = 0; i < L->n; ++i) {
        PyObject *a = argv[i], *v = NULL, *view = Py_None;
        kp[i] = buf + L->params[i].offset;
        if (pack(&L->params[i], a, device, kp[i], &v)) goto out;
        PyTuple_SET_ITEM(values, i, v);
        if (L->params[i].kind == 'p' && a != Py_None && !PyLong_CheckExact(a)) { /* a plain array (pack read it) */
            PyObject *blk = SLOT(a, a_block), *owner = NULL;
            view = SLOT(a, a_arg);
            view = view == NULL || view == Py_None ? PyObject_CallMethodNoArgs(a, str_view_spec) : Py_NewRef(view);
            if (view == NULL || blk == NULL) goto out_view;
            PyTuple_SET_ITEM(views, i, view);
            int owned = (owner = PyObject_GetAttr(blk, str_owner)) == NULL ? -1 : PySequence_Contains(owners, owner);
            Py_XDECREF(owner);
            if (owned < 0 || (!owned && PyList_Append(kept, a))) goto out;
            continue;
        out_view:
            Py_XDECREF(view);
            goto out;
        }
        PyTuple_SET_ITEM(views, i, Py_NewRef(view));
    }
    if ((g = dims_tuple(&L->grid, grid)) == NULL || (b = dims_tuple(&L->block, block)) == NULL ||
        (sh = PyLong_FromUnsignedLongLong(shared)) == NULL ||
        (launch = tuple6(launch_type, fnobj, g, b, sh, values, views)) == NULL ||
        (patch = PyTuple_Pack(2, kernel, launch)) == NULL || (empty = PyTuple_New(0)) == NULL ||
        (node = tuple6(node_type, Py_None, str_kernel, name, empty, patch, Py_True)) == NULL)
        goto out;
    void *fn = fns[LAUNCH]; /* (read with the GIL held: bind() may change it) */
    if (fn == NULL) goto out;
    CUresult err;
    Py_BEGIN_ALLOW_THREADS
    err = ((launch_t)fn)((handle)function, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                                  (unsigned)shared, (handle)raw_stream, L->n ? kp : NULL, NULL);
    Py_END_ALLOW_THREADS
    if (err) goto out; /* nothing was queued: the Python path launches again and reports it */
    done = 1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(kept) && done == 1; ++i)
        if (PyList_Append(keep, PyList_GET_ITEM(kept, i))) done = -1;
    if (done == 1 && PyList_Append(nodes, node)) done = -1;
    if (done < 0) { /* the node is in the graph, its record or what it keeps is not: the capture cannot end well */
        PyObject *why = PyUnicode_FromString("out of memory while recording a kernel launch; the capture is invalid");
        if (why != NULL) {
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            if (PyDict_SetItem(d, str_invalid, why)) PyErr_Clear();
            PyErr_Restore(type, value, tb);
            Py_DECREF(why);
        }
    }
out:
    if (done == 0 && cleared()) done = -1;
    Py_DECREF(d);
    Py_XDECREF(memory);
    Py_XDECREF(keep), Py_XDECREF(nodes), Py_XDECREF(owners), Py_XDECREF(name), Py_XDECREF(values);
    Py_XDECREF(views), Py_XDECREF(kept), Py_XDECREF(g), Py_XDECREF(b), Py_XDECREF(sh);
    Py_XDECREF(launch), Py_XDECREF(patch), Py_XDECREF(node), Py_XDECREF(empty);
    return done;
}

/* A checked launch on a captured stream, given to L->record(device, stream, grid, block,
   shared_mem, values, args) as Kernel.launch gives it to Kernel.enqueue. NULL with no exception
   set: an argument the Python path must decide. */
static PyObject *record(Launcher *L, PyObject *const *argv, PyObject *device, PyObject *stream,
                        const unsigned grid[3], const unsigned block[3], unsigned long long shared,
                        unsigned char *buf) {
    PyObject *values = PyTuple_New(L->n), *given = NULL, *out = NULL;
    if (values == NULL) return NULL;
    for (Py_ssize_t i = 0; i < L->n; ++i) {
        PyObject *v = NULL;
        if (pack(&L->params[i], argv[i], device, buf + L->params[i].offset, &v)) {
            Py_DECREF(values);
            return NULL; /* (an error while building a value is left set) */
        }
        PyTuple_SET_ITEM(values, i, v);
    }
    PyObject *g = dims_tuple(&L->grid, grid), *b = g == NULL ? NULL : dims_tuple(&L->block, block);
    PyObject *sh = PyLong_FromUnsignedLongLong(shared);
    given = PyTuple_New(L->n);
    if (g != NULL && b != NULL && sh != NULL && given != NULL) {
        for (Py_ssize_t i = 0; i < L->n; ++i) PyTuple_SET_ITEM(given, i, Py_NewRef(argv[i]));
        PyObject *call[7] = {device, stream, g, b, sh, values, given};
        out = PyObject_Vectorcall(L->record, call, 7, NULL);
    }
    Py_XDECREF(g);
    Py_XDECREF(b);
    Py_XDECREF(sh);
    Py_DECREF(values);
    Py_XDECREF(given);
    return out;
}

/* This thread's current stream of `device`, as Device.current_stream finds it: *found is
   borrowed from *current (a new reference the caller drops), or NULL where no stream of the
   device was made current (its default stream then). 0 done, 1 not readable here, -1 error. */
static int current_of(PyObject *device, PyObject **current, PyObject **found) {
    *found = NULL;
    if (PyContextVar_Get(current_var, NULL, current) < 0) return -1;
    if (*current == NULL) return 0;
    if (!PyTuple_CheckExact(*current)) return 1;
    for (Py_ssize_t i = PyTuple_GET_SIZE(*current) - 1; i >= 0; --i) {
        PyObject *s = PyTuple_GET_ITEM(*current, i);
        if (Py_TYPE(s) == stream_type && SLOT(s, s_device) == device) {
            *found = s;
            break;
        }
    }
    return 0;
}

/* 1 if `stream` is open: another library's (no finalizer), or an owned one whose finalizer is
   alive; 0 if closed or not known; -1 if reading it raised. */
static int stream_open(PyObject *stream) {
    PyObject *fin = SLOT(stream, s_finalizer);
    if (fin == NULL) return 0;
    if (fin == Py_None) return 1;
    if (finalize_registry != NULL && Py_TYPE(fin) == finalize_type) /* what finalize.alive reads */
        return PyDict_Contains(finalize_registry, fin);
    PyObject *alive = PyObject_GetAttr(fin, str_alive);
    int open = alive == NULL ? -1 : PyObject_IsTrue(alive);
    Py_XDECREF(alive);
    return open;
}

/* The call, holding `*held` (the device's plan, borrowed from L->devices, which Python code run
   meanwhile may replace) until the caller drops it. */
static PyObject *launcher_call_holding(Launcher *L, PyObject *const *args, size_t nargsf, PyObject *kwnames,
                                       PyObject **held) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *stream = NULL, *current = NULL;
    unsigned long long shared = 0;
    unsigned grid[3], block[3];
    void *fn = fns[LAUNCH];
    if (fn == NULL || array_base == NULL || nargs != L->n + 2) goto hand;
    if (kwnames != NULL) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); ++i) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, i), *value = args[nargs + i];
            if (name == str_stream) {
                stream = value == Py_None ? NULL : value;
            } else if (name == str_shared_mem && PyLong_CheckExact(value)) {
                int overflow;
                long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
                if (overflow || v < 0 || v > 0xFFFFFFFFll) goto hand;
                shared = (unsigned long long)v;
            } else {
                goto hand; /* device=, or anything else */
            }
        }
    }
    if (dims(args[0], GRID, grid) || dims(args[1], BLOCK, block) ||
        (unsigned long long)block[0] * block[1] * block[2] > 1024)
        goto hand;
    PyObject *device = NULL;
    if (stream != NULL) {
        if (Py_TYPE(stream) != stream_type) goto hand;
        device = SLOT(stream, s_device);
    } else {
        for (Py_ssize_t i = 0; i < L->n && device == NULL; ++i) { /* the first array's device */
            PyObject *a = args[2 + i];
            if (a != Py_None && !PyLong_CheckExact(a) && !PyFloat_CheckExact(a)) {
                if (is_plain(Py_TYPE(a)) != 1) goto hand; /* (what Python's path takes for a device) */
                device = SLOT(a, a_device);
            }
        }
    }
    if (device == NULL) goto hand;
    PyObject *plan = PyDict_GetItemWithError(L->devices, device);
    if (plan == NULL) {
        if (PyErr_Occurred()) return NULL;
        goto hand; /* not loaded on this device yet */
    }
    *held = Py_NewRef(plan);
    if (stream == NULL) { /* this thread's current stream of the device */
        int got = current_of(device, &current, &stream);
        if (got < 0) return NULL;
        if (got > 0) goto hand;
        if (stream == NULL) stream = PyTuple_GET_ITEM(plan, 1);
    }
    PyObject *recording = SLOT(stream, s_recording);
    if (SLOT(stream, s_device) != device || recording == NULL || (recording != Py_None && L->record == NULL))
        goto hand;
    if (stream_open(stream) != 1) goto hand;
    uintptr_t raw_stream, function;
    PyObject *h = SLOT(stream, s_handle);
    if (h == NULL || !PyLong_CheckExact(h) || as_address(h, &raw_stream) ||
        as_address(PyTuple_GET_ITEM(plan, 0), &function))
        goto hand;
    _Alignas(16) unsigned char buf[MAX_BYTES];
    void *kp[MAX_PARAMS];
    if (recording != Py_None) { /* captured: recorded here, or checked here and recorded by the Python path */
        int here = record_here(L, args + 2, device, stream, recording,
                               PyTuple_GET_SIZE(plan) > 2 ? PyTuple_GET_ITEM(plan, 2) : NULL, function, raw_stream,
                               grid, block, shared);
        if (here) {
            Py_XDECREF(current);
            if (here < 0) return NULL;
            L->fast++;
            Py_RETURN_NONE;
        }
        PyObject *out = record(L, args + 2, device, stream, grid, block, shared, buf);
        Py_XDECREF(current);
        if (out == NULL && !PyErr_Occurred()) goto hand_over; /* (nothing set: an argument to hand) */
        if (out != NULL) L->fast++;
        return out;
    }
    for (Py_ssize_t i = 0; i < L->n; ++i) {
        kp[i] = buf + L->params[i].offset;
        if (pack(&L->params[i], args[2 + i], device, buf + L->params[i].offset, NULL)) goto hand;
    }
    CUresult err;
    Py_BEGIN_ALLOW_THREADS
    err = ((launch_t)fn)((handle)function, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                         (unsigned)shared, (handle)raw_stream, L->n ? kp : NULL, NULL);
    Py_END_ALLOW_THREADS
    Py_XDECREF(current);
    if (err) return PyObject_Vectorcall(L->slow, args, nargsf, kwnames); /* it reports the error */
    L->fast++;
    Py_RETURN_NONE;
hand:
    Py_XDECREF(current);
    if (cleared()) return NULL;
hand_over:
    L->handed++;
    return PyObject_Vectorcall(L->slow, args, nargsf, kwnames);
}

static PyObject *launcher_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Launcher *L = (Launcher *)self;
    if (L->slow == NULL || L->devices == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "this Launcher was cleared");
        return NULL;
    }
    PyObject *held = NULL;
    PyObject *out = launcher_call_holding(L, args, nargsf, kwnames, &held);
    Py_XDECREF(held);
    return out;
}

static void launcher_clear_params(Launcher *L) {
    for (Py_ssize_t i = 0; i < L->n; ++i) Py_CLEAR(L->params[i].pointee);
}

/* Launcher(slow, layout, record=None, issue=None): layout is one (kind, size, offset, pointee or
   None) per parameter; without `record`, launches on captured streams go to `slow`; `issue` is
   what Launcher.issue falls back on. */
static PyObject *launcher_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *slow, *layout, *rec = Py_None, *issue = Py_None;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "Launcher takes positional arguments only");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OO|OO:Launcher", &slow, &layout, &rec, &issue)) return NULL;
    if (!PyCallable_Check(slow) || (rec != Py_None && !PyCallable_Check(rec)) ||
        (issue != Py_None && !PyCallable_Check(issue))) {
        PyErr_SetString(PyExc_TypeError, "Launcher's slow path, record and issue must be callable");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(layout, "Launcher's layout must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > MAX_PARAMS) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "a Launcher takes at most %d parameters, got %zd", MAX_PARAMS, n);
    }
    Launcher *L = (Launcher *)type->tp_alloc(type, 0);
    if (L == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    L->vectorcall = launcher_call;
    for (Py_ssize_t i = 0; i < n; ++i) {
        param_t *p = &L->params[i];
        const char *kind;
        PyObject *pointee;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "sinO", &kind, &p->size, &p->offset, &pointee))
            goto fail;
        p->kind = kind[0];
        L->n = i + 1;
        p->pointee = pointee == Py_None ? NULL : Py_NewRef(pointee);
        int sized = p->kind == 'p' ? p->size == 8
                    : p->kind == 'f' ? p->size == 4 || p->size == 8
                    : p->kind == 'b' ? p->size == 1
                    : (p->kind == 'i' || p->kind == 'u') &&
                          (p->size == 1 || p->size == 2 || p->size == 4 || p->size == 8);
        if (strlen(kind) != 1 || !sized || p->offset < 0 || p->offset + p->size > MAX_BYTES ||
            p->offset % p->size) {
            PyErr_Format(PyExc_ValueError, "parameter %zd: no fast packing for (%s, %d, %zd)", i, kind,
                         p->size, p->offset);
            goto fail;
        }
    }
    Py_DECREF(seq);
    L->slow = Py_NewRef(slow);
    L->record = rec == Py_None ? NULL : Py_NewRef(rec);
    L->issue = issue == Py_None ? NULL : Py_NewRef(issue);
    if ((L->devices = PyDict_New()) == NULL) {
        Py_DECREF(L);
        return NULL;
    }
    return (PyObject *)L;
fail:
    Py_DECREF(seq);
    Py_DECREF(L);
    return NULL;
}

static int launcher_traverse(Launcher *L, visitproc visit, void *arg) {
    Py_VISIT(L->slow);
    Py_VISIT(L->record);
    Py_VISIT(L->issue);
    Py_VISIT(L->devices);
    Py_VISIT(L->grid);
    Py_VISIT(L->block);
    for (Py_ssize_t i = 0; i < L->n; ++i) Py_VISIT(L->params[i].pointee);
    return 0;
}

static int launcher_clear(Launcher *L) {
    Py_CLEAR(L->slow);
    Py_CLEAR(L->record);
    Py_CLEAR(L->issue);
    Py_CLEAR(L->devices);
    Py_CLEAR(L->grid);
    Py_CLEAR(L->block);
    launcher_clear_params(L);
    return 0;
}

static void launcher_dealloc(Launcher *L) {
    PyObject_GC_UnTrack(L);
    launcher_clear(L);
    Py_TYPE(L)->tp_free((PyObject *)L);
}

/* add(device, function, stream, loaded=None): launch on `device` through CUfunction `function`,
   on `stream` when no other is current; with `loaded` (the backend's loaded kernel, what a
   KernelLaunch names), launches on captured streams are recorded here too (record_here). */
static PyObject *launcher_add(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Launcher *L = (Launcher *)self;
    uintptr_t f;
    if (nargs < 3 || nargs > 4 || stream_type == NULL || Py_TYPE(args[2]) != stream_type) {
        PyErr_SetString(PyExc_TypeError,
                        "add takes a device, a CUfunction address, a Stream and the loaded kernel (configure first)");
        return NULL;
    }
    if (as_address(args[1], &f)) return NULL;
    PyObject *plan = nargs == 4 && args[3] != Py_None
                         ? Py_BuildValue("(KOO)", (unsigned long long)f, args[2], args[3])
                         : Py_BuildValue("(KO)", (unsigned long long)f, args[2]);
    if (plan == NULL) return NULL;
    int rc = PyDict_SetItem(L->devices, args[0], plan);
    Py_DECREF(plan);
    if (rc) return NULL;
    Py_RETURN_NONE;
}

/* issue(stream, launch): queue a KernelLaunch (function, grid, block, shared_mem, values, views)
   whose values the Python path or this Launcher converted, as the backend's launch() does: the
   work of a recorded launch. Anything unexpected, or a driver error, goes to that launch(). */
static PyObject *launcher_issue(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Launcher *L = (Launcher *)self;
    if (nargs != 2 || L->issue == NULL) {
        PyErr_SetString(PyExc_TypeError, "issue takes a stream and a KernelLaunch (and a Launcher made with issue)");
        return NULL;
    }
    PyObject *launch = args[1], *h = NULL;
    void *fn = fns[LAUNCH];
    unsigned grid[3], block[3];
    uintptr_t stream, function;
    if (fn == NULL || !PyTuple_Check(launch) || PyTuple_GET_SIZE(launch) != 6) goto fallback;
    PyObject *values = PyTuple_GET_ITEM(launch, 4), *shm = PyTuple_GET_ITEM(launch, 3);
    if (!PyTuple_CheckExact(values) || PyTuple_GET_SIZE(values) != L->n || !PyLong_CheckExact(shm) ||
        dims(PyTuple_GET_ITEM(launch, 1), GRID, grid) || dims(PyTuple_GET_ITEM(launch, 2), BLOCK, block))
        goto fallback;
    unsigned long shared = PyLong_AsUnsignedLong(shm);
    if ((shared == (unsigned long)-1 && PyErr_Occurred()) || shared > 0xFFFFFFFFul) goto fallback;
    h = PyObject_GetAttr(PyTuple_GET_ITEM(launch, 0), str_handle);
    if (h == NULL || as_address(h, &function) || as_address(args[0], &stream)) goto fallback;
    _Alignas(16) unsigned char buf[MAX_BYTES];
    void *kp[MAX_PARAMS];
    for (Py_ssize_t i = 0; i < L->n; ++i) {
        kp[i] = buf + L->params[i].offset;
        if (pack(&L->params[i], PyTuple_GET_ITEM(values, i), NULL, kp[i], NULL)) goto fallback;
    }
    CUresult err;
    Py_BEGIN_ALLOW_THREADS
    err = ((launch_t)fn)((handle)function, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                         (unsigned)shared, (handle)stream, L->n ? kp : NULL, NULL);
    Py_END_ALLOW_THREADS
    if (err) goto fallback; /* it raises the driver's error (or recovers a missing context) */
    Py_DECREF(h);
    Py_RETURN_NONE;
fallback:
    Py_XDECREF(h);
    if (cleared()) return NULL;
    return PyObject_Vectorcall(L->issue, args, 2, NULL);
}

static PyObject *launcher_counts(PyObject *self, PyObject *unused) {
    Launcher *L = (Launcher *)self;
    return Py_BuildValue("(KK)", L->fast, L->handed);
}

static PyMethodDef launcher_methods[] = {
    {"add", (PyCFunction)(void (*)(void))launcher_add, METH_FASTCALL, "add(device, function, stream, loaded=None)"},
    {"issue", (PyCFunction)(void (*)(void))launcher_issue, METH_FASTCALL,
     "issue(stream, launch): queue a checked KernelLaunch, as the backend's launch() does"},
    {"counts", launcher_counts, METH_NOARGS, "(launches made in C, calls handed to the Python path)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LauncherType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cudagraphs._fastcall.Launcher",
    .tp_basicsize = sizeof(Launcher),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Launcher(slow, layout, record=None): a kernel's launch plan; called as Kernel.launch.",
    .tp_new = launcher_new,
    .tp_dealloc = (destructor)launcher_dealloc,
    .tp_traverse = (traverseproc)launcher_traverse,
    .tp_clear = (inquiry)launcher_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Launcher, vectorcall),
    .tp_methods = launcher_methods,
};

/* ---- Node updates: the repeat path of Graph.rebind ------------------------------------- */

/* The views a NodeRecord (handle, kind, name, views, patch, top) uses: a kernel's are in its
   patch, (kernel, KernelLaunch(function, grid, block, shared_mem, values, views)). */
static PyObject *record_views(PyObject *r) {
    if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 6) return NULL;
    PyObject *kind = PyTuple_GET_ITEM(r, 1), *patch = PyTuple_GET_ITEM(r, 4);
    if (patch != Py_None && PyUnicode_Check(kind) && PyUnicode_CompareWithASCIIString(kind, "kernel") == 0) {
        if (!PyTuple_Check(patch) || PyTuple_GET_SIZE(patch) != 2) return NULL;
        PyObject *launch = PyTuple_GET_ITEM(patch, 1);
        if (!PyTuple_Check(launch) || PyTuple_GET_SIZE(launch) != 6) return NULL;
        return PyTuple_GET_ITEM(launch, 5);
    }
    return PyTuple_GET_ITEM(r, 3);
}

/* users(records, key): the indices of the records whose node uses the view `key`. */
static PyObject *users(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "users takes a list of node records and a view");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(args[0]); ++i) {
        PyObject *views = record_views(PyList_GET_ITEM(args[0], i));
        int hit = views == NULL || !PyTuple_Check(views) ? -2 : PySequence_Contains(views, args[1]);
        if (hit == -2) PyErr_Format(PyExc_TypeError, "record %zd is not a node record", i);
        if (hit < 0) {
            Py_DECREF(out);
            return NULL;
        }
        if (hit) {
            PyObject *index = PyLong_FromSsize_t(i);
            if (index == NULL || PyList_Append(out, index)) {
                Py_XDECREF(index);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(index);
        }
    }
    return out;
}

typedef struct { /* CUDA_KERNEL_NODE_PARAMS_v2 */
    handle func;
    unsigned grid[3], block[3], shared;
    void **params, **extra;
    handle kern, ctx;
} node_params_t;

/* One kernel node's change, prepared with the GIL held and set with it released: its parameters
   (packed into buf), its record's new values and views, and what the new record is built from. */
typedef struct {
    _Alignas(16) unsigned char buf[MAX_BYTES];
    void *kp[MAX_PARAMS];
    node_params_t p;
    uintptr_t node;
    Py_ssize_t index, at; /* the record's index in records; the hit's position in hits */
    PyObject *r, *nvalues, *nviews; /* (held) the old record; its launch's new values and views */
} prepared_t;

static void prepared_clear(prepared_t *q) {
    Py_CLEAR(q->r);
    Py_CLEAR(q->nvalues);
    Py_CLEAR(q->nviews);
}

/* Prepare record r's node to move: `key`'s arguments point at `ptr` (their views: `spec`), the
   function's address read through `function` (the kernel function object's, cached by the
   caller for the last object seen). 0, or -1 with an exception. */
static int patch_prepare(Launcher *L, PyObject *r, PyObject *key, PyObject *spec, PyObject *ptr, PyObject **last_fn,
                         uintptr_t *function, prepared_t *q) {
    PyObject *launch = PyTuple_GET_ITEM(PyTuple_GET_ITEM(r, 4), 1);
    PyObject *values = PyTuple_GET_ITEM(launch, 4), *views = PyTuple_GET_ITEM(launch, 5);
    memset(&q->p, 0, sizeof q->p);
    if (!PyTuple_CheckExact(values) || !PyTuple_Check(views) || PyTuple_GET_SIZE(values) != L->n ||
        PyTuple_GET_SIZE(views) != L->n) {
        PyErr_SetString(PyExc_TypeError, "a kernel record with other arguments than its Launcher's");
        return -1;
    }
    unsigned long shared = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(launch, 3));
    if ((shared == (unsigned long)-1 && PyErr_Occurred()) || shared > 0xFFFFFFFFul ||
        dims(PyTuple_GET_ITEM(launch, 1), GRID, q->p.grid) || dims(PyTuple_GET_ITEM(launch, 2), BLOCK, q->p.block)) {
        PyErr_SetString(PyExc_ValueError, "a kernel record with another launch shape");
        return -1;
    }
    PyObject *fn = PyTuple_GET_ITEM(launch, 0);
    if (fn != *last_fn) { /* (the nodes of one kernel share its function object) */
        PyObject *h = PyObject_GetAttr(fn, str_handle);
        int bad = h == NULL || as_address(h, function);
        Py_XDECREF(h);
        if (bad) return -1;
        Py_XSETREF(*last_fn, Py_NewRef(fn));
    }
    if (as_address(PyTuple_GET_ITEM(r, 0), &q->node)) return -1;
    if ((q->nvalues = PyTuple_New(L->n)) == NULL || (q->nviews = PyTuple_New(L->n)) == NULL) return -1;
    for (Py_ssize_t j = 0; j < L->n; ++j) {
        PyObject *v = PyTuple_GET_ITEM(views, j);
        int moved = v == key ? 1 : v == Py_None ? 0 : PyObject_RichCompareBool(v, key, Py_EQ);
        if (moved < 0) return -1;
        PyObject *value = moved ? ptr : PyTuple_GET_ITEM(values, j);
        PyTuple_SET_ITEM(q->nvalues, j, Py_NewRef(value));
        PyTuple_SET_ITEM(q->nviews, j, Py_NewRef(moved ? spec : v));
        q->kp[j] = q->buf + L->params[j].offset;
        if (pack(&L->params[j], value, NULL, q->kp[j], NULL)) {
            PyErr_Format(PyExc_ValueError, "argument %zd of a kernel record does not pack", j);
            return -1;
        }
    }
    q->p.func = (handle)*function;
    q->p.shared = (unsigned)shared;
    q->p.params = L->n ? q->kp : NULL;
    q->r = Py_NewRef(r);
    return 0;
}

/* The new record of a prepared node that the driver took (a new reference), or NULL. */
static PyObject *patch_record(prepared_t *q) {
    PyObject *r = q->r, *patch = PyTuple_GET_ITEM(r, 4), *launch = PyTuple_GET_ITEM(patch, 1);
    PyObject *nlaunch = tuple6(Py_TYPE(launch), PyTuple_GET_ITEM(launch, 0), PyTuple_GET_ITEM(launch, 1),
                               PyTuple_GET_ITEM(launch, 2), PyTuple_GET_ITEM(launch, 3), q->nvalues, q->nviews);
    PyObject *npatch = nlaunch == NULL ? NULL : PyTuple_Pack(2, PyTuple_GET_ITEM(patch, 0), nlaunch);
    Py_XDECREF(nlaunch);
    if (npatch == NULL) return NULL;
    PyObject *out = tuple6(Py_TYPE(r), PyTuple_GET_ITEM(r, 0), PyTuple_GET_ITEM(r, 1), PyTuple_GET_ITEM(r, 2),
                           PyTuple_GET_ITEM(r, 3), npatch, PyTuple_GET_ITEM(r, 5));
    Py_DECREF(npatch);
    return out;
}

/* The record that `hit` (an index) names in `records`, borrowed, with the index in *i; NULL with
   an exception for an index out of range or an item that is not a node record. */
static PyObject *hit_record(PyObject *records, PyObject *hit, Py_ssize_t *i) {
    *i = PyLong_AsSsize_t(hit);
    if (*i == -1 && PyErr_Occurred()) return NULL;
    if (*i < 0 || *i >= PyList_GET_SIZE(records)) {
        PyErr_SetString(PyExc_IndexError, "a hit is not an index of records");
        return NULL;
    }
    PyObject *r = PyList_GET_ITEM(records, *i);
    if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 6)
        return PyErr_Format(PyExc_TypeError, "record %zd is not a node record", *i);
    return r;
}

/* patch_kernels(exec, records, hits, key, spec, ptr): for each index in hits that is a kernel
   record whose kernel has a Launcher, the node's arguments that use the view `key` set to `ptr`
   and the record replaced. Returns the hits it left to the caller, in order: the other records,
   and from one it could not prepare or the driver refused on (the caller redoes that one its own
   way, which raises). Nodes are prepared in chunks with the GIL held and set with it released
   once per chunk (cuGraphExecKernelNodeSetParams for each); the records are replaced after. */
#define PATCH_CHUNK 64
static PyObject *patch_kernels(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uintptr_t exec, function = 0;
    if (nargs != 6 || !PyList_Check(args[1]) || !PyList_Check(args[2]) || !PyLong_CheckExact(args[5])) {
        PyErr_SetString(PyExc_TypeError, "patch_kernels takes exec, records, hits, key, spec and an address");
        return NULL;
    }
    if (as_address(args[0], &exec)) return NULL;
    PyObject *records = args[1], *last_fn = NULL, *last_kernel = NULL, *last_fast = NULL;
    PyObject *hits = PyList_AsTuple(args[2]); /* (a snapshot: Python code may run below) */
    PyObject *rest = hits == NULL ? NULL : PyList_New(0);
    prepared_t *chunk = rest == NULL ? NULL : PyMem_Malloc(PATCH_CHUNK * sizeof(prepared_t));
    if (chunk == NULL) {
        if (rest != NULL) PyErr_NoMemory();
        Py_XDECREF(hits);
        Py_XDECREF(rest);
        return NULL;
    }
    int m = 0, failed = 0;
    /* from the first hit this cannot patch for sure (unbound entry point, a record it cannot
       read, a driver refusal), it and every later one go back to the caller's Python loop */
    Py_ssize_t refused_at = fns[NODE_SET] == NULL ? 0 : -1, k = 0, nh = PyTuple_GET_SIZE(hits);
    while (refused_at < 0 && !failed && k <= nh) {
        /* phase 1 (GIL): prepare consecutive patchable hits; a hit it leaves ends the chunk */
        PyObject *left = NULL; /* (a hit for the caller, appended after the chunk is done) */
        for (; k < nh && m < PATCH_CHUNK; ++k) {
            Py_ssize_t i;
            PyObject *views = NULL, *r = Py_XNewRef(hit_record(records, PyTuple_GET_ITEM(hits, k), &i));
            if (r == NULL || (views = record_views(r)) == NULL) {
                if (r != NULL) PyErr_Format(PyExc_TypeError, "record %zd is not a node record", i);
                Py_XDECREF(r);
                failed = 1;
                break;
            }
            /* (r held: reading an attribute below may run Python code that changes records) */
            PyObject *fast = NULL;
            if (views != PyTuple_GET_ITEM(r, 3)) { /* a kernel record: has it a Launcher? */
                PyObject *kernel = PyTuple_GET_ITEM(PyTuple_GET_ITEM(r, 4), 0);
                if (kernel != last_kernel) {
                    PyObject *f = PyObject_GetAttr(kernel, str_fast);
                    if (f == NULL) {
                        Py_DECREF(r);
                        failed = 1;
                        break;
                    }
                    Py_XSETREF(last_fast, Py_TYPE(f) == &LauncherType ? f : NULL);
                    if (last_fast != f) Py_DECREF(f);
                    Py_XSETREF(last_kernel, Py_NewRef(kernel));
                }
                fast = last_fast;
            }
            if (fast == NULL) { /* not a kernel record with a Launcher: the caller's */
                Py_DECREF(r);
                left = Py_NewRef(PyTuple_GET_ITEM(hits, k++));
                break;
            }
            prepared_t *q = &chunk[m];
            q->r = q->nvalues = q->nviews = NULL;
            q->index = i, q->at = k;
            Py_INCREF(fast); /* (held while it packs: last_fast may be replaced) */
            int bad = patch_prepare((Launcher *)fast, r, args[3], args[4], args[5], &last_fn, &function, q);
            Py_DECREF(fast);
            Py_DECREF(r);
            if (bad) {
                prepared_clear(q);
                if (cleared()) failed = 1;
                else refused_at = k; /* the caller redoes this one and the rest, and raises */
                break;
            }
            m++;
        }
        /* phase 2 (no GIL): the driver calls; the first refusal ends them */
        int done = 0;
        CUresult err = 0;
        void *set = fns[NODE_SET]; /* (read with the GIL held: bind() may change it) */
        if (m && set != NULL && !failed) { /* (after an error nothing is set: records stay true) */
            Py_BEGIN_ALLOW_THREADS
            for (; done < m; ++done)
                if ((err = ((node_set_t)set)((handle)exec, (handle)chunk[done].node, &chunk[done].p)) != 0) break;
            Py_END_ALLOW_THREADS
        }
        if (done < m && refused_at < 0 && !failed) refused_at = chunk[done].at;
        /* phase 3 (GIL): the records of the nodes set */
        for (int j = 0; j < m; ++j) {
            prepared_t *q = &chunk[j];
            PyObject *moved = j < done && !failed ? patch_record(q) : NULL;
            if (j < done && !failed && moved == NULL) failed = 1;
            if (moved != NULL) {
                Py_ssize_t i = q->index;
                if (i < PyList_GET_SIZE(records) && PyList_GET_ITEM(records, i) == q->r) {
                    PyList_SET_ITEM(records, i, moved); /* (steals moved) */
                    Py_DECREF(q->r);                    /* (the list's reference to the old record) */
                } else {
                    Py_DECREF(moved); /* the list changed meanwhile: its new record stands */
                }
            }
            prepared_clear(q);
        }
        m = 0;
        if (left != NULL) {
            if (!failed && refused_at < 0 && PyList_Append(rest, left)) failed = 1;
            Py_DECREF(left);
        }
        if (k >= nh) break;
    }
    PyMem_Free(chunk);
    Py_XDECREF(last_fn);
    Py_XDECREF(last_kernel);
    Py_XDECREF(last_fast);
    if (!failed && refused_at >= 0) { /* the refused hit and every later one, in order */
        for (Py_ssize_t j = refused_at; j < nh && !failed; ++j)
            if (PyList_Append(rest, PyTuple_GET_ITEM(hits, j))) failed = 1;
    }
    Py_DECREF(hits);
    if (failed) {
        Py_DECREF(rest);
        return NULL;
    }
    return rest;
}

/* unpatchable(records, hits, copy_type): the first hit whose record cannot be changed node by
   node (no patch, or a "memcpy" record whose patch is not a copy_type), or -1; what Graph.rebind
   checks before it changes anything. */
static PyObject *unpatchable(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyList_Check(args[0]) || !PyList_Check(args[1]) || !PyType_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "unpatchable takes a list of records, a list of hits and the Copy class");
        return NULL;
    }
    PyObject *records = args[0], *hits = args[1];
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(hits); ++k) {
        Py_ssize_t i;
        PyObject *r = hit_record(records, PyList_GET_ITEM(hits, k), &i);
        if (r == NULL) return NULL;
        PyObject *kind = PyTuple_GET_ITEM(r, 1), *patch = PyTuple_GET_ITEM(r, 4);
        int memcpy_ = PyUnicode_Check(kind) && PyUnicode_CompareWithASCIIString(kind, "memcpy") == 0;
        if (patch == Py_None || (memcpy_ && !PyObject_TypeCheck(patch, (PyTypeObject *)args[2])))
            return PyLong_FromSsize_t(i);
    }
    return PyLong_FromLong(-1);
}

/* same_nodes(a, b): whether two lists of node records describe the same nodes, (kind, name) by
   (kind, name), as Graph.update needs; returns (the index of the first record that differs, or
   -1 when none does, a list being shorter counting as a difference at its end; the number of
   records of b that carry a driver handle). */
static PyObject *same_nodes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_Check(args[0]) || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "same_nodes takes two lists of node records");
        return NULL;
    }
    PyObject *a = args[0], *b = args[1];
    Py_ssize_t na = PyList_GET_SIZE(a), nb = PyList_GET_SIZE(b), first = -1, handles = 0;
    for (Py_ssize_t i = 0; i < nb; ++i) {
        PyObject *r = PyList_GET_ITEM(b, i);
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) < 3) return PyErr_Format(PyExc_TypeError, "record %zd is not a node record", i);
        handles += PyTuple_GET_ITEM(r, 0) != Py_None;
        if (first >= 0) continue;
        if (i >= na) {
            first = na;
            continue;
        }
        PyObject *q = PyList_GET_ITEM(a, i);
        if (!PyTuple_Check(q) || PyTuple_GET_SIZE(q) < 3) return PyErr_Format(PyExc_TypeError, "record %zd is not a node record", i);
        for (int j = 1; j < 3 && first < 0; ++j) {
            PyObject *x = PyTuple_GET_ITEM(q, j), *y = PyTuple_GET_ITEM(r, j);
            int same = x == y ? 1 : PyObject_RichCompareBool(x, y, Py_EQ);
            if (same < 0) return NULL;
            if (!same) first = i;
        }
    }
    if (first < 0 && na != nb) first = nb;
    return Py_BuildValue("(nn)", first, handles);
}

/* ---- Built-in element-wise ops' repeat path ---------------------------------------------
 *
 * Elementwise(python_op, kernel_name, armed, block, inputs) is called as the op,
 * op(a, b, ..., out=None, *, stream=None): with `out` given and every array a plain, dense array
 * of one shape, dtype and device, on the current stream, it launches the op's kernel through
 * its Launcher (armed[(kernel_name, dtype, device)] = (Launcher, grid cap), set by the first
 * launch) over the arrays' elements and returns `out`; anything else goes to python_op.
 */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *python, *name, *armed, *block, *dict;
    Py_ssize_t inputs;
} Elementwise;

static PyObject *elementwise_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Elementwise *E = (Elementwise *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf), m = E->inputs;
    PyObject *arrays[MAX_PARAMS], *key = NULL, *size = NULL, *grid = NULL, *out = NULL;
    if (array_base == NULL || a_shape < 0 || m + 4 > MAX_PARAMS || nargs < m || nargs > m + 1) goto python;
    for (Py_ssize_t i = 0; i < m; ++i) arrays[i + 1] = args[i];
    PyObject *dst = nargs == m + 1 ? args[m] : NULL;
    if (kwnames != NULL) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); ++i) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, i), *value = args[nargs + i];
            if (name == str_out && dst == NULL) dst = value;
            else if (!(name == str_stream && value == Py_None)) goto python;
        }
    }
    if (dst == NULL || dst == Py_None) goto python;
    arrays[0] = dst;
    PyObject *first = arrays[1], *device = NULL, *dtype = NULL, *shape = NULL;
    for (Py_ssize_t i = 0; i <= m; ++i) {
        PyObject *a = arrays[i];
        if (Py_TYPE(a) != array_base || SLOT(a, a_contig) != Py_True) goto python;
        if (i == 0) {
            device = SLOT(a, a_device), dtype = SLOT(a, a_dtype), shape = SLOT(a, a_shape);
            if (device == NULL || dtype == NULL || shape == NULL) goto python;
            continue;
        }
        if (SLOT(a, a_device) != device || SLOT(a, a_dtype) != dtype) goto python;
        PyObject *other = SLOT(a, a_shape);
        int same = other == shape ? 1 : other == NULL ? 0 : PyObject_RichCompareBool(other, shape, Py_EQ);
        if (same != 1) goto python;
    }
    size = SLOT(first, a_size);
    if (size == NULL || !PyLong_CheckExact(size)) goto python;
    Py_ssize_t n = PyLong_AsSsize_t(size);
    if (n <= 0) goto python; /* (an empty op launches nothing: the Python path's answer) */
    if ((key = PyTuple_Pack(3, E->name, dtype, device)) == NULL) return NULL;
    PyObject *plan = PyDict_GetItemWithError(E->armed, key);
    Py_DECREF(key);
    if (plan == NULL) {
        if (PyErr_Occurred()) return NULL;
        goto python; /* not launched on this device yet */
    }
    if (!PyTuple_Check(plan) || PyTuple_GET_SIZE(plan) != 2) goto python;
    PyObject *launcher = PyTuple_GET_ITEM(plan, 0);
    Py_ssize_t cap = PyLong_AsSsize_t(PyTuple_GET_ITEM(plan, 1));
    if (cap == -1 && PyErr_Occurred()) goto python;
    PyObject *block = PyTuple_GET_ITEM(E->block, 0);
    Py_ssize_t threads = PyLong_AsSsize_t(block), blocks = threads > 0 ? (n + threads - 1) / threads : 0;
    if (threads <= 0 || Py_TYPE(launcher) != &LauncherType) goto python;
    if ((grid = PyLong_FromSsize_t(blocks < cap ? blocks : cap)) == NULL) return NULL;
    PyObject *call[MAX_PARAMS];
    call[0] = grid, call[1] = E->block;
    for (Py_ssize_t i = 0; i <= m; ++i) call[2 + i] = arrays[i];
    call[3 + m] = size;
    Py_INCREF(launcher); /* (held: Python code run by the call may replace the armed plan) */
    out = launcher_call(launcher, call, (size_t)(m + 4), NULL);
    Py_DECREF(launcher);
    Py_DECREF(grid);
    if (out == NULL) return NULL;
    Py_DECREF(out);
    return Py_NewRef(dst);
python:
    if (cleared()) return NULL;
    return PyObject_Vectorcall(E->python, args, nargsf, kwnames);
}

static PyObject *elementwise_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *python, *name, *armed, *block;
    Py_ssize_t inputs;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "Elementwise takes positional arguments only");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OUO!O!n:Elementwise", &python, &name, &PyDict_Type, &armed, &PyTuple_Type, &block,
                          &inputs))
        return NULL;
    if (!PyCallable_Check(python) || inputs < 1 || inputs > MAX_PARAMS - 4 || PyTuple_GET_SIZE(block) != 3) {
        PyErr_SetString(PyExc_ValueError, "Elementwise takes the op, its kernel's name, the armed plans, a 3-tuple block and 1.. inputs");
        return NULL;
    }
    Elementwise *E = (Elementwise *)type->tp_alloc(type, 0);
    if (E == NULL) return NULL;
    E->vectorcall = elementwise_call;
    E->python = Py_NewRef(python), E->name = Py_NewRef(name), E->armed = Py_NewRef(armed), E->block = Py_NewRef(block);
    E->inputs = inputs;
    return (PyObject *)E;
}

static int elementwise_traverse(Elementwise *E, visitproc visit, void *arg) {
    Py_VISIT(E->python);
    Py_VISIT(E->name);
    Py_VISIT(E->armed);
    Py_VISIT(E->block);
    Py_VISIT(E->dict);
    return 0;
}

static int elementwise_clear(Elementwise *E) {
    Py_CLEAR(E->python);
    Py_CLEAR(E->name);
    Py_CLEAR(E->armed);
    Py_CLEAR(E->block);
    Py_CLEAR(E->dict);
    return 0;
}

static void elementwise_dealloc(Elementwise *E) {
    PyObject_GC_UnTrack(E);
    elementwise_clear(E);
    Py_TYPE(E)->tp_free((PyObject *)E);
}

static PyGetSetDef elementwise_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ElementwiseType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cudagraphs._fastcall.Elementwise",
    .tp_basicsize = sizeof(Elementwise),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Elementwise(op, kernel_name, armed, block, inputs): a built-in op's repeat path in C.",
    .tp_new = elementwise_new,
    .tp_dealloc = (destructor)elementwise_dealloc,
    .tp_traverse = (traverseproc)elementwise_traverse,
    .tp_clear = (inquiry)elementwise_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Elementwise, vectorcall),
    .tp_dictoffset = offsetof(Elementwise, dict),
    .tp_getset = elementwise_getset,
};

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

static int api_take(PyObject *lock, int blocking, double timeout) { return lock_take((Lock *)lock, blocking, timeout); }
static int api_give(PyObject *lock) { return lock_give((Lock *)lock); }

/* What compiled modules call (_fastcall_api.h; the capsule `api`). */
static cg_api_t api = {
    .version = CG_API_VERSION,
    .lock_type = &LockType,
    .lock_take = api_take,
    .lock_give = api_give,
    .graph_launch = api_graph_launch,
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

static PyMethodDef methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL, "bind(name, address)"},
    {"bound", bound, METH_O, "bound(name): the address bound to name (0: none)."},
    {"names", names, METH_NOARGS, "The driver functions this module calls, in bind() names."},
    {"unpatchable", (PyCFunction)(void (*)(void))unpatchable, METH_FASTCALL,
     "unpatchable(records, hits, Copy): the first hit that cannot be changed node by node, or -1"},
    {"same_nodes", (PyCFunction)(void (*)(void))same_nodes, METH_FASTCALL,
     "same_nodes(a, b): (first index where two record lists differ in (kind, name) or -1, b's handles)"},
    {"users", (PyCFunction)(void (*)(void))users, METH_FASTCALL,
     "users(records, key): indices of the node records that use the view key"},
    {"patch_kernels", (PyCFunction)(void (*)(void))patch_kernels, METH_FASTCALL,
     "patch_kernels(exec, records, hits, key, spec, ptr): move kernel nodes' arguments; returns the rest"},
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL,
     "configure(array_type, stream_type, current_streams): the classes Launchers read."},
    {"configure_capture", (PyCFunction)(void (*)(void))configure_capture, METH_FASTCALL,
     "configure_capture(Recording, NodeRecord, KernelLaunch): captured launches recorded in C."},
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
    if (PyType_Ready(&LauncherType) < 0 || PyType_Ready(&ElementwiseType) < 0 ||
        PyType_Ready(&LockType) < 0)
        return NULL;
    str_stream = PyUnicode_InternFromString("stream");
    str_shared_mem = PyUnicode_InternFromString("shared_mem");
    str_alive = PyUnicode_InternFromString("alive");
    str_handle = PyUnicode_InternFromString("handle");
    str_fast = PyUnicode_InternFromString("fast");
    str_out = PyUnicode_InternFromString("out");
    if (str_fast == NULL || str_out == NULL) return NULL;
    PyObject **names_[] = {&str_thread, &str_invalid, &str_frees, &str_memory, &str_owners, &str_keep,
                           &str_nodes, &str_owner, &str_name, &str_view_spec, &str_kernel};
    const char *texts[] = {"thread", "invalid", "frees", "memory", "owners", "keep",
                           "nodes", "owner", "name", "_view_spec", "kernel"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; ++i)
        if ((*names_[i] = PyUnicode_InternFromString(texts[i])) == NULL) return NULL;
    if (str_stream == NULL || str_shared_mem == NULL || str_alive == NULL || str_handle == NULL) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Launcher", (PyObject *)&LauncherType) < 0 ||
        PyModule_AddObjectRef(m, "Elementwise", (PyObject *)&ElementwiseType) < 0 ||
        PyModule_AddObjectRef(m, "Lock", (PyObject *)&LockType) < 0 ||
        PyModule_AddObject(m, "api", PyCapsule_New(&api, CG_API_CAPSULE, NULL)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
