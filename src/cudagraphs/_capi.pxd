# The C part's functions for the compiled modules (_fastcall_api.h, the declared contract), and C
# primitives they use: cimported by the modules that call them; _capi.py holds their plain-Python
# forms, which the same modules import where they run as Python. Each compiled module calls
# cg_api_load(_fastcall.api) once at import; until then, and where the C part is not built, the
# trampolines answer CG_UNBOUND and the caller takes the backend's primitive.
# docs/architecture.md, "The compiled part", says what may be declared here and why.

cdef extern from "_fastcall_api.h":
    int CG_UNBOUND
    int CG_ERROR
    int cg_api_load(object capsule) except -1
    int cg_lock_take(object lock, bint blocking) except -1
    int cg_lock_give(object lock) except -1
    int cg_graph_launch(size_t exec_, size_t stream)
    int cg_issue(object issue, size_t stream, object arg) except? -1
    int cg_launch(object packer, size_t function, object grid, object block, unsigned shared, size_t stream,
                  object values) except? -1
    object cg_nodes_new(size_t exec_, Py_ssize_t expected)
    int cg_nodes_add(object batch, object packer, size_t node, size_t function, object grid, object block,
                     unsigned shared, object values) except? -1
    Py_ssize_t cg_nodes_set(object batch)

cdef extern from *:
    """
    /* tuple.__new__(type, items) for a tuple subclass with no fields of its own (a NamedTuple),
       made without the call and its argument tuple (per launch and recorded node) */
    static PyObject *cg_tuple_new(PyObject *type, PyObject *items) {
        PyTypeObject *t = (PyTypeObject *)type;
        Py_ssize_t n = PyTuple_GET_SIZE(items);
        if (!PyType_Check(type) || !PyType_IsSubtype(t, &PyTuple_Type) ||
            t->tp_basicsize != PyTuple_Type.tp_basicsize || t->tp_itemsize != PyTuple_Type.tp_itemsize ||
            t->tp_dictoffset != 0)
            return PyObject_CallMethod((PyObject *)&PyTuple_Type, "__new__", "OO", type, items);
        PyObject *out = t->tp_alloc(t, n);
        if (out == NULL) return NULL;
        for (Py_ssize_t i = 0; i < n; ++i) PyTuple_SET_ITEM(out, i, Py_NewRef(PyTuple_GET_ITEM(items, i)));
        return out;
    }

    /* Item i of a tuple or of a tuple subclass (a NamedTuple): a NamedTuple's sequence slot is
       CPython's generic one (it calls __getitem__, a thousand instructions), which compiled
       indexing of an untyped object takes; this reads the item (else indexes as Python does) */
    static PyObject *cg_item(PyObject *t, Py_ssize_t i) {
        if (PyTuple_Check(t) && (size_t)i < (size_t)PyTuple_GET_SIZE(t))
            return Py_NewRef(PyTuple_GET_ITEM(t, i));
        PyObject *key = PyLong_FromSsize_t(i);
        if (key == NULL) return NULL;
        PyObject *out = PyObject_GetItem(t, key);
        Py_DECREF(key);
        return out;
    }
    """
    object cg_tuple_new(object type, tuple items)
    object cg_item(object t, Py_ssize_t i)
