# The compiled form of interop/_keep.py (Cython's pure-Python mode: the .py is the one source): the
# census of the live arrays at the end of a capture with other libraries' nodes, a loop over every
# object the collector tracks (a million in a large program: compiled, a few tens of ms).
# docs/architecture.md, "The compiled part", says what may be declared here and why.

cimport cython

@cython.locals(kinds=dict, spans=dict, start=object, end=object)
cpdef list _spans(list libraries, Py_ssize_t device_index)
