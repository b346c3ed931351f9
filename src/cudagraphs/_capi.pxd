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
    /* tuple.__new__(type, (a, b, c, d, e, f)) for a tuple subclass with no fields of its own (a
       NamedTuple of six: KernelLaunch, NodeRecord), made without the call and without a tuple of
       the items (per launch, recorded node and rebound node) */
    static PyObject *cg_tuple6(PyObject *type, PyObject *a, PyObject *b, PyObject *c, PyObject *d,
                               PyObject *e, PyObject *f) {
        PyTypeObject *t = (PyTypeObject *)type;
        PyObject *items[6] = {a, b, c, d, e, f};
        if (!PyType_Check(type) || !PyType_IsSubtype(t, &PyTuple_Type) ||
            t->tp_basicsize != PyTuple_Type.tp_basicsize || t->tp_itemsize != PyTuple_Type.tp_itemsize ||
            t->tp_dictoffset != 0) {
            PyObject *packed = PyTuple_Pack(6, a, b, c, d, e, f), *out;
            if (packed == NULL) return NULL;
            out = PyObject_CallMethod((PyObject *)&PyTuple_Type, "__new__", "OO", type, packed);
            Py_DECREF(packed);
            return out;
        }
        PyObject *out = t->tp_alloc(t, 6);
        if (out == NULL) return NULL;
        for (Py_ssize_t i = 0; i < 6; ++i) PyTuple_SET_ITEM(out, i, Py_NewRef(items[i]));
        return out;
    }

    /* The values of one launch, filled one by one: a new tuple of n empty slots (a tuple: one
       allocation, from CPython's free list, where a list is two), and item i of such a tuple set
       (each slot once, before the tuple is handed on; anything else is refused) */
    static PyObject *cg_values(Py_ssize_t n) {
        if (n < 0) {
            PyErr_SetString(PyExc_ValueError, "cg_values: a negative length");
            return NULL;
        }
        return PyTuple_New(n);
    }
    static int cg_put(PyObject *values, Py_ssize_t i, PyObject *value) {
        if (!PyTuple_CheckExact(values) || i < 0 || i >= PyTuple_GET_SIZE(values) ||
            PyTuple_GET_ITEM(values, i) != NULL) {
            PyErr_SetString(PyExc_ValueError, "cg_put: not an empty slot of a tuple from cg_values");
            return -1;
        }
        PyTuple_SET_ITEM(values, i, Py_NewRef(value));
        return 0;
    }

    /* A copy of tuple values where item j is new wherever views[j] is key (identity first, then
       ==; a None view never is), or values itself where none is (NULL: an error is set) */
    static PyObject *cg_replaced_where(PyObject *values, PyObject *views, PyObject *key, PyObject *new) {
        Py_ssize_t n = PyTuple_GET_SIZE(values);
        if (PyTuple_GET_SIZE(views) != n) {
            PyErr_SetString(PyExc_ValueError, "values and views differ in length");
            return NULL;
        }
        PyObject *out = NULL;
        for (Py_ssize_t j = 0; j < n; ++j) {
            PyObject *v = PyTuple_GET_ITEM(views, j);
            int hit = v == key;
            if (!hit && v != Py_None && (hit = PyObject_RichCompareBool(v, key, Py_EQ)) < 0) {
                Py_XDECREF(out);
                return NULL;
            }
            if (!hit) continue;
            if (out == NULL) {
                if ((out = PyTuple_New(n)) == NULL) return NULL;
                for (Py_ssize_t i = 0; i < n; ++i) PyTuple_SET_ITEM(out, i, Py_NewRef(PyTuple_GET_ITEM(values, i)));
            }
            Py_SETREF(PyTuple_GET_ITEM(out, j), Py_NewRef(new));
        }
        return out == NULL ? Py_NewRef(values) : out;
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

    /* Whether the type of obj is one of types (a list), by identity */
    static int cg_type_in(PyObject *obj, PyObject *types) {
        Py_ssize_t m = PyList_GET_SIZE(types);
        for (Py_ssize_t k = 0; k < m; ++k)
            if ((PyObject *)Py_TYPE(obj) == PyList_GET_ITEM(types, k)) return 1;
        return 0;
    }

    /* Whether the type of one of objs (any iterable: a tuple or list read in place) is one of
       types (a list), by identity: a scan of a launch's few arguments, without a reference taken
       per item (-1: an error is set) */
    static int cg_types_in(PyObject *objs, PyObject *types) {
        PyObject *seq = PySequence_Fast(objs, "the objects must be iterable");
        if (seq == NULL) return -1;
        PyObject **items = PySequence_Fast_ITEMS(seq);
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        int found = 0;
        for (Py_ssize_t i = 0; i < n && !found; ++i) found = cg_type_in(items[i], types);
        Py_DECREF(seq);
        return found;
    }

    /* list.pop() of a list's last item, the list's storage kept as it is (list.pop shrinks it
       when it holds less than half of that, and grows it again at the next append: a free list
       taken from and given back to, one block at a time); IndexError where it is empty */
    static PyObject *cg_pop(PyObject *items) {
        Py_ssize_t n = PyList_GET_SIZE(items);
        if (n == 0) {
            PyErr_SetString(PyExc_IndexError, "pop from empty list");
            return NULL;
        }
        PyObject *last = PyList_GET_ITEM(items, n - 1);
        Py_SET_SIZE(items, n - 1); /* (its reference, the list's, is the caller's now) */
        return last;
    }

    /* A signature of a sequence of (a, b) pairs by identity, h the one of the pairs before:
       equal signatures of two sequences of one length say that they hold the same objects, in the
       same order, but for a collision of 64-bit hashes (a node record's kind and name, as a
       capture records them: Graph.update compares them without reading a record) */
    static unsigned long long cg_mix(unsigned long long h, PyObject *a, PyObject *b) {
        h = (h ^ (unsigned long long)(uintptr_t)a) * 0x9E3779B97F4A7C15ull;
        h = (h ^ (unsigned long long)(uintptr_t)b) * 0xC2B2AE3D27D4EB4Full;
        return h ^ (h >> 29);
    }

    /* This thread's identifier, as threading.get_ident() gives it (a C integer: no int object) */
    static unsigned long cg_thread_ident(void) { return PyThread_get_thread_ident(); }

    /* Item k of tuple t, borrowed (NULL, with IndexError or TypeError set, where t has none) */
    static PyObject *cg_borrow(PyObject *t, Py_ssize_t k) {
        if (!PyTuple_Check(t)) {
            PyErr_Format(PyExc_TypeError, "a tuple was expected, got %.200s", Py_TYPE(t)->tp_name);
            return NULL;
        }
        if ((size_t)k >= (size_t)PyTuple_GET_SIZE(t)) {
            PyErr_SetString(PyExc_IndexError, "tuple index out of range");
            return NULL;
        }
        return PyTuple_GET_ITEM(t, k);
    }

    /* The first index where two lists of tuples differ in item k1 or item k2 (identity first,
       then ==), or -1; a list that ends first differs there (-2: an error is set). (Each record
       checked once, its items then read in place: a thousand records in a few microseconds.) */
    static Py_ssize_t cg_first_difference(PyObject *mine, PyObject *theirs, Py_ssize_t k1, Py_ssize_t k2) {
        Py_ssize_t k = k1 > k2 ? k1 : k2, i = 0;
        if (k1 < 0 || k2 < 0) {
            PyErr_SetString(PyExc_IndexError, "tuple index out of range");
            return -2;
        }
        for (; i < PyList_GET_SIZE(mine) && i < PyList_GET_SIZE(theirs); ++i) {
            PyObject *a = PyList_GET_ITEM(mine, i), *b = PyList_GET_ITEM(theirs, i), *x1, *y1, *x2, *y2;
            if (PyTuple_Check(a) && PyTuple_Check(b) && PyTuple_GET_SIZE(a) > k && PyTuple_GET_SIZE(b) > k) {
                /* (the common case: the four items read in place, the same objects mostly) */
                x1 = PyTuple_GET_ITEM(a, k1), y1 = PyTuple_GET_ITEM(b, k1);
                x2 = PyTuple_GET_ITEM(a, k2), y2 = PyTuple_GET_ITEM(b, k2);
                if (x1 == y1 && x2 == y2) continue;
            } else if ((x1 = cg_borrow(a, k1)) == NULL || (y1 = cg_borrow(b, k1)) == NULL) {
                return -2;
            } else {
                x2 = y2 = NULL; /* (read after item k1 compares equal, as Python would) */
            }
            Py_INCREF(a), Py_INCREF(b); /* (held while == runs code of the items' own) */
            int same = x1 == y1 ? 1 : PyObject_RichCompareBool(x1, y1, Py_EQ);
            if (same > 0 && x2 == NULL && ((x2 = cg_borrow(a, k2)) == NULL || (y2 = cg_borrow(b, k2)) == NULL))
                same = -1;
            if (same > 0 && x2 != y2) same = PyObject_RichCompareBool(x2, y2, Py_EQ);
            Py_DECREF(a), Py_DECREF(b);
            if (same <= 0) return same < 0 ? -2 : i;
        }
        return PyList_GET_SIZE(mine) == PyList_GET_SIZE(theirs) ? -1 : i;
    }

    /* The first index of a list of tuples whose item k is None (none = 1) or is not (none = 0),
       or -1 (-2: an error is set) */
    static Py_ssize_t cg_scan_none(PyObject *items, Py_ssize_t k, int none) {
        if (k < 0) {
            PyErr_SetString(PyExc_IndexError, "tuple index out of range");
            return -2;
        }
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); ++i) {
            PyObject *t = PyList_GET_ITEM(items, i), *x;
            if (PyTuple_Check(t) && PyTuple_GET_SIZE(t) > k) {
                x = PyTuple_GET_ITEM(t, k);
            } else if ((x = cg_borrow(t, k)) == NULL) {
                return -2;
            }
            if ((x == Py_None) == none) return i;
        }
        return -1;
    }
    static Py_ssize_t cg_first_not_none(PyObject *items, Py_ssize_t k) { return cg_scan_none(items, k, 0); }
    static Py_ssize_t cg_first_none(PyObject *items, Py_ssize_t k) { return cg_scan_none(items, k, 1); }

    """
    unsigned long cg_thread_ident()
    object cg_tuple6(object type, object a, object b, object c, object d, object e, object f)
    object cg_values(Py_ssize_t n)
    int cg_put(object values, Py_ssize_t i, object value) except -1
    tuple cg_replaced_where(tuple values, tuple views, object key, object new)
    object cg_item(object t, Py_ssize_t i)
    bint cg_types_in(object objs, list types) except -1
    bint cg_type_in(object obj, list types)
    object cg_pop(list items)
    unsigned long long cg_mix(unsigned long long h, object a, object b)
    Py_ssize_t cg_first_difference(list mine, list theirs, Py_ssize_t k1, Py_ssize_t k2) except -2
    Py_ssize_t cg_first_not_none(list items, Py_ssize_t k) except -2
    Py_ssize_t cg_first_none(list items, Py_ssize_t k) except -2
