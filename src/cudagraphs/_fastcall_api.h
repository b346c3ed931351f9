/* The C part's functions for the compiled modules: the declared contract between them.
 *
 * cudagraphs._fastcall (_fastcall.c) fills one cg_api_t and offers it as the capsule
 * `cudagraphs._fastcall.api`; a compiled module that calls into it cimports _capi.pxd, which
 * declares the functions below, and calls cg_api_load(capsule) once at import. Until then, or
 * where the C part is not built, every function answers as a driver whose entry point is not
 * bound (CG_UNBOUND) and the caller takes its Python path (the backend's primitive).
 *
 * What lives behind these functions is no decision: the driver calls of the hot paths (their
 * entry points bound by the cuda backend, see _fastcall.c's bind) and the packing of kernel
 * arguments a Python caller already checked and converted. docs/architecture.md, "The compiled
 * part", says why.
 */
#ifndef CUDAGRAPHS_FASTCALL_API_H
#define CUDAGRAPHS_FASTCALL_API_H

#include <Python.h>
#include <stdint.h>

#define CG_API_CAPSULE "cudagraphs._fastcall.api"
#define CG_API_VERSION 2

/* What a trampoline returns besides a CUresult (>= 0): no entry point bound, or a Python error
   set (an argument that does not pack) */
#define CG_UNBOUND (-2)
#define CG_ERROR (-1)

typedef struct {
    int version;
    /* the C Lock: its type, take (1 taken, 0 busy, -1 error) and give (0, or -1 with an error) */
    PyTypeObject *lock_type;
    int (*lock_take)(PyObject *lock, int blocking, double timeout);
    int (*lock_give)(PyObject *lock);
    /* cuGraphLaunch(exec, stream), the GIL released */
    int (*graph_launch)(uintptr_t exec, uintptr_t stream);
    /* a Work's issue(stream, arg) where `issue` is a kernel's Packer's issue: packed and launched
       (cuLaunchKernel, the GIL released); CG_UNBOUND for any other issue, or what this cannot do */
    int (*issue)(PyObject *issue, uintptr_t stream, PyObject *arg);
    /* a kernel's launch through its Packer: the function at `function` over grid x block (3-tuples
       of ints), `values` (its converted arguments) packed; CG_UNBOUND where this cannot do it */
    int (*launch)(PyObject *packer, uintptr_t function, PyObject *grid, PyObject *block, unsigned shared,
                  uintptr_t stream, PyObject *values);
    /* kernel nodes of the executable graph at `exec` set to new parameters, a batch of them to one
       release of the GIL: nodes_new makes a batch (room for `expected` nodes, or fewer: a new
       reference; None where no entry point is bound; NULL with an exception); nodes_add packs one
       node's parameters into it through the kernel's Packer (the function at `function` over grid x
       block, `values` its converted arguments): 0 added, 1 added and the batch full (set it before
       adding more), CG_UNBOUND not added (the caller sets that node its own way), CG_ERROR;
       nodes_set calls cuGraphExecKernelNodeSetParams for each node added since, in order, and
       returns how many it set before the driver refused one (the caller sets that one its own way,
       which reports the error) */
    PyObject *(*nodes_new)(uintptr_t exec, Py_ssize_t expected);
    int (*nodes_add)(PyObject *batch, PyObject *packer, uintptr_t node, uintptr_t function, PyObject *grid,
                     PyObject *block, unsigned shared, PyObject *values);
    Py_ssize_t (*nodes_set)(PyObject *batch);
} cg_api_t;

#ifndef CUDAGRAPHS_FASTCALL_PROVIDER /* (the compiled modules' side) */

static cg_api_t *cg_api = NULL; /* (one per compiled module: each loads it) */

static inline int cg_api_load(PyObject *capsule) {
    cg_api_t *api = (cg_api_t *)PyCapsule_GetPointer(capsule, CG_API_CAPSULE);
    if (api == NULL) return -1;
    if (api->version != CG_API_VERSION) {
        PyErr_Format(PyExc_ImportError, "cudagraphs._fastcall offers API version %d, this module needs %d",
                     api->version, CG_API_VERSION);
        return -1;
    }
    cg_api = api;
    return 0;
}

/* lock.acquire(blocking) for the C Lock without a method call, else through the method */
static inline int cg_lock_take(PyObject *lock, int blocking) {
    if (cg_api != NULL && Py_TYPE(lock) == cg_api->lock_type) return cg_api->lock_take(lock, blocking, -1.0);
    PyObject *got = PyObject_CallMethod(lock, "acquire", "O", blocking ? Py_True : Py_False);
    int taken = got == NULL ? -1 : PyObject_IsTrue(got);
    Py_XDECREF(got);
    return taken;
}

/* lock.release(), likewise */
static inline int cg_lock_give(PyObject *lock) {
    if (cg_api != NULL && Py_TYPE(lock) == cg_api->lock_type) return cg_api->lock_give(lock);
    PyObject *done = PyObject_CallMethod(lock, "release", NULL);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

static inline int cg_graph_launch(size_t exec, size_t stream) {
    return cg_api == NULL ? CG_UNBOUND : cg_api->graph_launch((uintptr_t)exec, (uintptr_t)stream);
}

static inline int cg_issue(PyObject *issue, size_t stream, PyObject *arg) {
    return cg_api == NULL ? CG_UNBOUND : cg_api->issue(issue, (uintptr_t)stream, arg);
}

static inline int cg_launch(PyObject *packer, size_t function, PyObject *grid, PyObject *block, unsigned shared,
                            size_t stream, PyObject *values) {
    return cg_api == NULL ? CG_UNBOUND
                          : cg_api->launch(packer, (uintptr_t)function, grid, block, shared, (uintptr_t)stream, values);
}

static inline PyObject *cg_nodes_new(size_t exec, Py_ssize_t expected) {
    if (cg_api == NULL) Py_RETURN_NONE;
    return cg_api->nodes_new((uintptr_t)exec, expected);
}

static inline int cg_nodes_add(PyObject *batch, PyObject *packer, size_t node, size_t function, PyObject *grid,
                               PyObject *block, unsigned shared, PyObject *values) {
    return cg_api == NULL ? CG_UNBOUND
                          : cg_api->nodes_add(batch, packer, (uintptr_t)node, (uintptr_t)function, grid, block,
                                              shared, values);
}

static inline Py_ssize_t cg_nodes_set(PyObject *batch) { return cg_api == NULL ? 0 : cg_api->nodes_set(batch); }

#endif /* CUDAGRAPHS_FASTCALL_PROVIDER */
#endif /* CUDAGRAPHS_FASTCALL_API_H */
