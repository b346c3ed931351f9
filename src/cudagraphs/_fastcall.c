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
#include <string.h>

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

enum {
    LAUNCH, GRAPH_LAUNCH, COPY_DD, COPY_HD, COPY_DH, MEMSET, ALLOC, FREE, EVENT_RECORD, WAIT_EVENT,
    NODE_SET, COUNT
};
static const char *NAMES[COUNT] = {
    "cuLaunchKernel", "cuGraphLaunch", "cuMemcpyDtoDAsync", "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync",
    "cuMemsetD8Async", "cuMemAllocFromPoolAsync", "cuMemFreeAsync", "cuEventRecord", "cuStreamWaitEvent",
    "cuGraphExecKernelNodeSetParams",
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
    if (PyUnicode_Check(o) || PyBytes_Check(o) || PyFloat_Check(o)) {
        PyErr_Format(PyExc_TypeError, "a handle or address must be an int, got %.80s", Py_TYPE(o)->tp_name);
        return -1;
    }
    PyObject *n = PyNumber_Long(o);
    if (n == NULL) return -1;
    unsigned long long v = PyLong_AsUnsignedLongLong(n);
    Py_DECREF(n);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *out = (uintptr_t)v;
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
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "cudagraphs._fastcall",
    "The hot paths' driver calls at C's cost (optional; see the C source).", -1, methods,
};

PyMODINIT_FUNC PyInit__fastcall(void) { return PyModule_Create(&module); }
