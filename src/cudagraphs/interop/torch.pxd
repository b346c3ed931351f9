# The compiled form of interop/torch.py (Cython's pure-Python mode: the .py is the one source): a
# tensor's description and PyTorch's current stream, which a graphed call of tensors asks for on
# every call, as compiled functions.
# docs/architecture.md, "The compiled part", says what may be declared here and why.

# (module globals the calls read: C globals, read without a dictionary lookup, which Python 3.12
# and later make compiled code do for every global it reads)
cdef dict _DTYPES
cdef list _RAW
