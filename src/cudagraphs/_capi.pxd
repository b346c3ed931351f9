# The C part's functions for the compiled modules (_fastcall_api.h, the declared contract): a
# declaration-only .pxd, cimported by the modules that call them. Each such module calls
# cg_api_load(_fastcall.api) once at import; until then, and where the C part is not built, the
# trampolines answer CG_UNBOUND and the caller takes its Python path.
# docs/architecture.md, "The compiled part", says what may be declared here and why.

cdef extern from "_fastcall_api.h":
    int CG_UNBOUND
    int CG_ERROR
    int cg_api_load(object capsule) except -1
    int cg_lock_take(object lock, bint blocking) except -1
    int cg_lock_give(object lock) except -1
    int cg_graph_launch(size_t exec_, size_t stream)
