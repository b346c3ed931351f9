"""Training through graphed callables: a forward and a backward graph per key (``grad=True``).

``cg.graphed(fn, grad=True)`` makes a callable whose calls in PyTorch's grad
mode are differentiable, with the contract of PyTorch's
``torch.cuda.make_graphed_callables``:

* the function is captured twice per key (each bucket): its forward, and
  ``torch.autograd.grad(outputs, inputs that require grad + params,
  grad_outputs=static grad buffers)``, both into the callable's one pool;
* a call stages its inputs, replays the forward graph and returns the
  static outputs detached and wrapped by a ``torch.autograd.Function``
  (:func:`_function`): plain tensors that autograd tracks, overwritten by the
  callable's next call (``copy_outputs=True`` returns copies);
* that Function's backward copies the incoming gradients into the static
  grad-output buffers (the padding rows of a bucket zeroed), replays the
  backward graph and returns copies of the static gradients, which autograd
  accumulates into ``.grad`` as it does eagerly (the parameters' made by a
  few multi-tensor kernels, :func:`_copies`, not a ``clone()`` each);
* the parameters are a ``torch.nn.Module``'s (the module passed as the
  function) or the ``params=`` given for a plain function.

A key is the arguments' spec, dtypes and (bucketed) shapes, the module's
``training`` flag and whether gradients flow (grad mode on and an input or
a parameter requiring grad): an eval-mode call and a ``no_grad`` call get
graphs of their own (forward only, as without ``grad``). What is refused,
never answered with a wrong gradient: a backward after a later call of the
callable (its graphs share a pool: the saved activations are overwritten;
:class:`~cudagraphs.StaleOutputError`), a second backward without
``retain_graph`` (PyTorch's own error), a double backward (``create_graph``:
RuntimeError), an input or parameter whose ``requires_grad`` differs from
the key's first grad-mode call (ValueError), a parameter replaced since the
capture (:class:`~cudagraphs.StaleParameterError`).

Inside another capture, a differentiable call runs the function as it is:
the enclosing capture records it, and its backward where that runs.

PyTorch is never imported here; it is looked up in ``sys.modules``.
"""

from __future__ import annotations

import functools
import operator
import sys
from collections.abc import Callable
from typing import Any

from . import interop
from ._argtree import flatten, unflatten
from ._capture import CaptureSession
from ._device import Stream
from ._errors import CaptureError, StaleOutputError, StaleParameterError
from ._staging import Entry, Input, array_of, first_rows, new_input
from .interop.torch import ADAPTER as _TORCH

__all__ = ["Trainer", "is_module", "refuse_untracked"]


def is_module(fn: Any) -> bool:
    """Whether ``fn`` is a ``torch.nn.Module`` (False where PyTorch is not imported)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(fn, torch.nn.Module)


def refuse_untracked(fn: Any, ins: list[Input]) -> None:
    """Refuse a forward-only capture whose outputs autograd would need to track.

    Called when a key of a callable made without ``grad=True`` is captured:
    in PyTorch's grad mode, an input that requires grad, or a module whose
    parameters do, would get outputs with no gradient path (the graph
    records no backward).

    Raises
    ------
    ValueError
        Naming the two ways out: ``grad=True`` or ``torch.no_grad()``.
    """
    torch = sys.modules.get("torch")
    if torch is None or not torch.is_grad_enabled():
        return
    what = None
    for j, i in enumerate(ins):
        if i.lib is not None and getattr(i.obj, "requires_grad", False):
            what = f"input {j} requires grad"
            break
    if what is None and is_module(fn) and any(p.requires_grad for p in fn.parameters()):
        what = "the module's parameters require grad"
    if what is not None:
        raise ValueError(
            f"graphed: {what} in PyTorch's grad mode, but this callable captures no backward "
            "(its outputs would carry no gradient): make it with cg.graphed(fn, grad=True) to "
            "train through it, or call it under torch.no_grad()/torch.inference_mode()"
        )


class _Step:
    """A differentiable key: its forward entry, backward graph and static gradient buffers."""

    __slots__ = (
        "backward",
        "entry",
        "grad_ins",
        "grad_outs",
        "grads",
        "params",
        "plan",
        "ptrs",
        "views",
    )

    def __init__(self, entry: Entry) -> None:
        self.entry = entry
        self.backward: Any = None  # the backward Graph (None: no output needs a gradient)
        self.views: list[Any] = []  # the static inputs as the function saw them
        self.grad_ins: list[int] = []  # which inputs require grad (their indices)
        self.params: tuple[Any, ...] = ()  # the parameters that require grad
        self.ptrs: tuple[int, ...] = ()  # their addresses at the capture
        self.grad_outs: list[Any] = []  # per output: its static grad buffer, or None
        self.grads: tuple[Any, ...] = ()  # the backward's static gradients (inputs, params)
        self.plan: tuple[list[Any], str] = ([], "")  # how _copies copies the params' gradients


class Trainer:
    """The differentiable calls of one :class:`~cudagraphs.GraphedCallable` (``grad=True``).

    Parameters
    ----------
    owner : GraphedCallable
        The callable: its lock, lease, staging, pool, streams and the
        forward-only machinery that calls without gradients use.
    params : tuple or None
        A plain function's parameters (``params=``); None for a module (its
        own) or a function without any.
    describe : callable
        How the owner describes an argument (``_describe``).
    eager_streams : callable
        The owner's routing of other libraries' streams for eager runs.
    """

    def __init__(
        self,
        owner: Any,
        params: tuple[Any, ...] | None,
        describe: Callable[[Any, Any], Input],
        eager_streams: Callable[[Any, Stream], Any],
    ) -> None:
        self.owner = owner
        self.module = owner.fn if is_module(owner.fn) else None
        self.given = params if params is not None else ()
        module = self.module
        self.tree = _Tree(module, sys.modules["torch"].nn.Module) if module is not None else None
        self.describe = describe
        self.eager_streams = eager_streams
        self.steps: dict[Any, _Step] = {}
        self.flags: dict[Any, Any] = {}  # per key, the requires_grad of its first grad-mode call
        self.token: Any = None  # a tensor each call's Function saves (torch frees it after a backward)

    def _params(self) -> tuple[Any, ...]:
        tree = self.tree
        return tree.parameters() if tree is not None else self.given

    # the call ----------------------------------------------------------------------------
    def _arguments(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Any, list[Any], Any, list[Any], Any]:
        """(PyTorch, the arguments' leaves, their tree's spec, each leaf described, the staging)."""
        owner = self.owner
        leaves: list[Any] = []
        spec = flatten((args, kwargs), leaves)
        ins = [self.describe(x, owner.device) for x in leaves]
        return sys.modules.get("torch"), leaves, spec, ins, owner._staging

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """One call (the owner's lock held): differentiable where gradients flow."""
        owner = self.owner
        torch, leaves, spec, ins, staging = self._arguments(args, kwargs)
        n, bucket = staging.bucket(ins)
        shapes = tuple([(i.dtype, staging.shape(i.shape, bucket)) for i in ins])
        base = (spec, shapes, self._mode())
        params = self._params()
        flags = self._flags(base, leaves, params, torch)
        grad = flags is not None and (any(flags[0]) or any(flags[1]))
        owner._lease.count()
        stream = owner._begin_on(owner._stream_of(self._source(ins, grad, torch)))
        if grad and stream._recording is not None:
            # inside another capture: it records the function as it is, and its backward
            return owner.fn(*args, **kwargs)
        if not grad:
            return self._forward_only(base, spec, args, kwargs, ins, n, bucket, stream)
        key = (*base, "grad")
        step = self.steps.get(key)
        if step is None:
            owner._misses += 1
            assert flags is not None
            step = self._capture(key, spec, ins, flags[0], params, n, bucket, stream)
        else:
            step.entry.hits += 1
            if step.entry.eager is None:
                self._check_params(step, params)
                staging.stage(step.entry, ins, n, bucket, stream)
        entry = step.entry
        if entry.graph is None:  # refused under fallback="eager", or nothing to replay
            with stream, self.eager_streams(owner.device, stream):
                return owner.fn(*args, **kwargs)
        entry.graph.replay(stream)
        return self._wrap(step, leaves, n, bucket, torch, stream)

    def _mode(self) -> Any:
        """The module's part of a key: its ``training`` flag ("train" for a plain function)."""
        module = self.module
        return "train" if module is None else bool(module.training)

    def _flags(self, base: Any, leaves: list[Any], params: tuple[Any, ...], torch: Any) -> Any:
        """In grad mode, (inputs' requires_grad, parameters'), checked against the key's first; else None.

        Raises
        ------
        ValueError
            Where they differ from the first grad-mode call of the key.
        """
        if torch is None or not torch.is_grad_enabled():
            return None
        flags = (
            tuple([bool(getattr(x, "requires_grad", False)) for x in leaves]),
            tuple([bool(p.requires_grad) for p in params]),
        )
        seen = self.flags.setdefault(base, flags)
        if seen != flags:
            raise ValueError(_flipped(seen, flags))
        return flags

    def _source(self, ins: list[Input], grad: bool, torch: Any) -> Any:
        """The call's stream source: a differentiable call's is PyTorch's current stream (autograd's)."""
        owner = self.owner
        if grad:  # (grad=True takes no stream=: the options refuse it)
            return interop_stream(torch, owner.device.index)
        return owner._stream_source(ins)

    def capture_all(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Capture every bucket's graphs for arguments like these, largest first (the lock held).

        Differentiable keys (grad mode, something requiring grad) get their
        forward and backward graphs; others their forward graph.
        """
        owner = self.owner
        torch, leaves, spec, ins, staging = self._arguments(args, kwargs)
        n, _ = staging.bucket(ins)
        if n is None:
            raise TypeError("capture_all takes example arguments with at least one device array")
        params = self._params()
        d = owner.dim
        owner._lease.calls += 1  # the static buffers change: earlier outputs are stale
        stream = None
        for b in reversed(owner.buckets):
            base = (spec, tuple([(i.dtype, staging.shape(i.shape, b)) for i in ins]), self._mode())
            flags = self._flags(base, leaves, params, torch)
            grad = flags is not None and (any(flags[0]) or any(flags[1]))
            if stream is None:
                stream = owner._begin_on(owner._stream_of(self._source(ins, grad, torch)))
            cut = ins
            if n > b:  # the examples' first b rows
                cut = []
                for i in ins:
                    part = array_of(i, owner.device)[first_rows(i.shape, d, b)]
                    cut.append(new_input(part, i.lib, part.ptr, part.shape, i.dtype, part.is_contiguous))
            if grad:
                key = (*base, "grad")
                if key not in self.steps:
                    assert flags is not None
                    self._capture(key, spec, cut, flags[0], params, min(n, b), b, stream)
            else:
                key = (*base, "forward")
                if key not in owner._entries:
                    owner._capture(key, spec, cut, min(n, b), b, stream)

    def _forward_only(
        self,
        base: Any,
        spec: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        ins: list[Input],
        n: int | None,
        bucket: int | None,
        stream: Stream,
    ) -> Any:
        """A call without gradients: the owner's forward graphs, keyed with the module's mode."""
        owner = self.owner
        entry = owner._entry((*base, "forward"), spec, ins, n, bucket, stream)
        if entry.graph is None:
            with stream, self.eager_streams(owner.device, stream):
                return owner.fn(*args, **kwargs)
        entry.graph.replay(stream)
        return owner._outputs(entry, n, bucket, stream)

    def _check_params(self, step: _Step, params: tuple[Any, ...]) -> None:
        now = [p for p in params if p.requires_grad]
        if (
            len(now) != len(step.params)
            or not all(map(operator.is_, now, step.params))  # (a new object on the same memory too)
            or tuple([p.data_ptr() for p in now]) != step.ptrs
        ):
            raise StaleParameterError(
                f"a parameter of {self.owner._lease.name} was replaced (or moved) since its graphs "
                "were captured: they read and write the old memory. Update parameters in place "
                "(p.data.copy_(...), an optimizer's step), or close() the callable to capture again"
            )

    # capture ------------------------------------------------------------------------------
    def _capture(
        self,
        key: Any,
        spec: Any,
        ins: list[Input],
        requires: tuple[bool, ...],
        params: tuple[Any, ...],
        n: int | None,
        bucket: int | None,
        stream: Stream,
    ) -> _Step:
        """Capture a differentiable key: its forward graph, then its backward graph.

        ``requires`` says which inputs require grad (the call's flags).
        """
        owner = self.owner
        torch = sys.modules["torch"]
        device = owner.device
        entry = Entry(bucket, len(ins))
        step = _Step(entry)
        entry.static = owner._staging.static_inputs(spec, ins, bucket)
        owner._staging.stage(entry, ins, n, bucket, stream)  # (copies on the stream: no copy nodes)
        views = []
        for j, (s, i) in enumerate(zip(entry.static, ins)):
            v = owner._as_lib(s, i.lib)
            if i.lib is not None and requires[j]:
                v = v.detach().requires_grad_(True)
                step.grad_ins.append(j)
            views.append(v)
        step.views = views
        step.params = tuple([p for p in params if p.requires_grad])
        step.ptrs = tuple([p.data_ptr() for p in step.params])
        wrt = [views[j] for j in step.grad_ins] + list(step.params)
        args, kwargs = unflatten(spec, views)
        for _ in range(owner.warmup):  # eagerly, forward and backward (as PyTorch's recipe)
            with stream, self.eager_streams(device, stream):
                outs = _tensors(owner.fn(*args, **kwargs), torch)
                diff = [o for o in outs if o.requires_grad]
                if diff:
                    torch.autograd.grad(diff, wrt, [torch.zeros_like(o) for o in diff], allow_unused=True)
                del outs, diff
        side = owner._capture_stream
        if side is None:
            side = owner._capture_stream = device.create_stream()
        side.wait(stream)
        before = owner.pool.reserved
        try:
            graph, out = self._captured(side, lambda: owner.fn(*args, **kwargs))
        except CaptureError as err:
            if owner.fallback != "eager":
                raise
            step.entry = owner._refused(key, bucket, len(ins), err)  # (in the owner's stats)
            self.steps[key] = step
            return step
        outs_list: list[Any] = []
        entry.out_spec = flatten(out, outs_list)
        for o in outs_list:
            if not isinstance(o, torch.Tensor):
                graph.close()
                raise TypeError(
                    f"graphed(grad=True): the function returned a {type(o).__name__}; a "
                    "differentiable call returns torch tensors (nested in tuples, lists, dicts)"
                )
        entry.outs = outs_list
        entry.out_libs = [interop.library_of(o) for o in outs_list]
        graph.keep(*entry.static)
        entry.graph = graph
        diff = [o for o in outs_list if o.requires_grad]
        step.grad_outs = [torch.empty_like(o) if o.requires_grad else None for o in outs_list]
        if diff and wrt:
            buffers = [g for g in step.grad_outs if g is not None]
            # (retain_graph: the forward's saved tensors stay, and no memory of theirs is handed
            # to the backward's own temporaries: a second backward before the next forward, as
            # retain_graph allows eagerly, reads them as they were)
            backward = functools.partial(
                torch.autograd.grad, diff, wrt, buffers, allow_unused=True, retain_graph=True
            )
            step.backward, grads = self._captured(side, backward)
            step.backward.keep(*buffers)
            step.grads = tuple(grads)
            step.plan = _plan(step.grads[len(step.grad_ins) :], torch)
        entry.memory = owner.pool.reserved - before
        self.steps[key] = step
        return step

    def _captured(self, side: Stream, run: Callable[[], Any]) -> tuple[Any, Any]:
        """Capture ``run()`` on ``side`` into the owner's pool; (the graph, what it returned)."""
        owner = self.owner
        session = CaptureSession(owner.device, side, owner.mode, owner.pool, "pool")
        session.begin()
        try:
            with side:
                result = run()
        except BaseException as exc:
            refusal = session.fail(exc, "run that part eagerly")
            if refusal is None:
                raise
            raise refusal from exc
        return session.end(), result

    # outputs and the backward -----------------------------------------------------------------
    def _wrap(
        self, step: _Step, leaves: list[Any], n: int | None, bucket: int | None, torch: Any, stream: Stream
    ) -> Any:
        """The outputs of a differentiable call: the static outputs, detached and wrapped.

        The Function is applied on the captures' side stream (after the
        call's ``stream``), where the parameters' AccumulateGrad nodes were
        made during the capture: autograd then runs the backward there and
        hands each gradient to ``.grad`` on the stream it was made on, where
        another stream would cost an event and a wait per parameter, and an
        allocator event per gradient freed (PyTorch orders the caller's
        stream after the backward's at its end).
        """
        owner = self.owner
        token = self.token
        if token is None:
            token = self.token = torch.zeros((), device=torch.device("cuda", owner.device.index))
        state = _CallState(self, step, owner._lease.calls, n, bucket)
        grad_in = [leaves[j] for j in step.grad_ins]
        side = owner._capture_stream
        side.wait(stream)
        with self.eager_streams(owner.device, side):
            outs = _function(torch).apply(state, token, *grad_in, *step.params)
        if owner.copy_outputs:  # (copies made on the side stream: the call's stream after them)
            stream.wait(side)
        return unflatten(step.entry.out_spec, list(outs))

    def forward_outputs(self, ctx: Any, state: _CallState) -> tuple[Any, ...]:
        """What the Function's forward returns: each static output (cut to the call's rows)."""
        step, n, bucket = state.step, state.n, state.bucket
        d = self.owner.dim
        result = []
        for o in step.entry.outs:
            if n is not None and n != bucket and o.dim() > d and o.shape[d] == bucket:
                o = o.narrow(d, 0, n)
            result.append(o.clone() if self.owner.copy_outputs else o.detach())
        undiff = [r for r, o in zip(result, step.entry.outs) if not o.requires_grad]
        if undiff:
            ctx.mark_non_differentiable(*undiff)
        return tuple(result)

    def backward(self, state: _CallState, grads: tuple[Any, ...], torch: Any) -> tuple[Any, ...]:
        """The Function's backward: grads copied in, the backward graph replayed, its grads copied out."""
        owner = self.owner
        step = state.step
        nothing = (None,) * (2 + len(step.grad_ins) + len(step.params))
        if step.backward is None:
            return nothing
        with owner._lock:
            if owner._lease.calls != state.call:
                raise StaleOutputError(
                    f"backward through a call of {owner._lease.name} after a later call (call "
                    f"{state.call}, now {owner._lease.calls}): its graphs share one pool, so the "
                    "saved activations and outputs of that call are overwritten. Run backward "
                    "before calling the graphed callable again (one graphed call per backward), "
                    "or call the function eagerly for that part"
                )
            n, bucket, d = state.n, state.bucket, owner.dim
            cut = n is not None and n != bucket
            for buf, g in zip(step.grad_outs, grads):
                if buf is None:
                    continue
                if cut and buf.dim() > d and buf.shape[d] == bucket:
                    assert n is not None
                    assert bucket is not None
                    buf.narrow(d, 0, n).copy_(g)
                    buf.narrow(d, n, bucket - n).zero_()  # padding rows: no gradient
                elif g is None:
                    buf.zero_()
                elif g.data_ptr() != buf.data_ptr():
                    buf.copy_(g)
            index = owner.device.index
            stream = owner._begin_on(owner.device.external_stream(interop_stream(torch, index)))
            step.backward.replay(stream)
            out: list[Any] = [None, None]
            k = len(step.grad_ins)
            for g in step.grads[:k]:
                if g is not None and cut and g.dim() > d and g.shape[d] == bucket:
                    g = g.narrow(d, 0, n)
                out.append(None if g is None else g.clone())  # (a copy: autograd may keep it as .grad)
            out += _copies(step, k, torch)
            return tuple(out)

    def close(self) -> None:
        """Free every differentiable key's graphs (the owner's lock held)."""
        steps, self.steps = self.steps, {}
        self.flags.clear()
        for step in steps.values():
            if step.entry.graph is not None:
                step.entry.graph.close()
            if step.backward is not None:
                step.backward.close()

    def named(self) -> list[tuple[Any, Any, Any]]:
        """(key, forward graph, entry) and (key, backward graph, entry) of the captured steps."""
        out = []
        for key, step in self.steps.items():
            if step.entry.graph is not None:
                out.append((key, step.entry.graph, step.entry))
            if step.backward is not None:
                out.append(((*key, "backward"), step.backward, step.entry))
        return out


class _Tree:
    """A module's ``parameters()``, walked again only where its tree of modules changed.

    Each differentiable call needs the module's parameters (a replaced one is refused, one
    whose ``requires_grad`` flipped too); ``tuple(module.parameters())`` walks every submodule
    and hashes every parameter in Python (the bench's decoder, 53 parameters in 35 modules:
    120-190 µs on a development machine's CPU, against about 20 µs for the check below).
    What it returns depends only on the ``_parameters`` and ``_modules`` dictionaries of the
    modules it reached (where no module's class overrides how they are walked): while each of
    those modules' two dictionaries holds the same objects, in order, the last answer stands.
    A parameter or submodule replaced, added or removed (by ``setattr``, ``del``, or in the
    dictionary itself), a dictionary replaced or a module's class swapped, is seen by the next
    call, which walks again.
    """

    __slots__ = ("base", "module", "modules", "params", "seen")

    def __init__(self, module: Any, base: type) -> None:
        self.module = module
        self.base = base  # torch.nn.Module: whose ways of walking the tree are read here
        self.modules: list[Any] | None = None  # the modules of the last walk (None: walk every call)
        self.seen: list[Any] = []  # their dictionaries' values then, in order
        self.params: tuple[Any, ...] = ()  # the last walk's answer

    def parameters(self) -> tuple[Any, ...]:
        """``tuple(module.parameters())``, from the last walk where nothing it read changed."""
        modules = self.modules
        if modules is not None:
            now = _values(modules)
            if len(now) == len(self.seen) and all(map(operator.is_, now, self.seen)):
                return self.params
        module = self.module
        self.params = tuple(module.parameters())
        modules = list(module.modules())
        base = self.base
        walked = ("parameters", "named_parameters", "_named_members", "named_modules", "modules")
        plain = all(getattr(type(m), name) is getattr(base, name) for m in modules for name in walked)
        self.modules = modules if plain else None
        self.seen = _values(modules) if plain else []
        return self.params


def _values(modules: list[Any]) -> list[Any]:
    """Each module's class and the values of its ``_parameters`` and ``_modules``, in order (read anew)."""
    out: list[Any] = []
    for m in modules:
        out.append(type(m))  # (a class swapped in may walk otherwise)
        out += m._parameters.values()
        out += m._modules.values()
    return out


def interop_stream(torch: Any, index: int) -> int:
    """The handle of PyTorch's current stream on device ``index`` (the backward's).

    The adapter's: asked twice a training step (the call, its backward), it makes no
    ``torch.cuda.Stream`` object where PyTorch has its raw query.
    """
    return _TORCH.current_stream(index)


def _copies(step: _Step, k: int, torch: Any) -> list[Any]:
    """Copies of the parameters' static gradients (``step.grads[k:]``, None kept).

    Copies, not the static buffers, so that the next replay cannot overwrite a ``.grad`` (nor
    add into itself: two backwards before ``zero_grad``); autograd keeps each copy as the
    ``.grad`` of a parameter whose ``.grad`` is None (``zero_grad()``'s default) without copying
    it again. Those of :func:`_plan`'s list are made by one ``torch._foreach_mul(list, 1.0)``
    (a few multi-tensor kernels, where a ``clone()`` each costs a launch and PyTorch's host work
    for each parameter); the others are cloned.
    """
    fast, kinds = step.plan
    made = torch._foreach_mul(fast, 1.0) if fast else []
    if len(made) == len(kinds):  # (the common case: every one of them)
        return made
    each = iter(made)
    return [
        next(each) if c == "f" else None if g is None else g.clone() for c, g in zip(kinds, step.grads[k:])
    ]


def _plan(grads: tuple[Any, ...], torch: Any) -> tuple[list[Any], str]:
    """How :func:`_copies` copies these static gradients: (those it multiplies by 1, a letter each).

    ``"f"``: multiplied, a gradient of a real floating dtype, whose x * 1.0 is x exactly
    (IEEE: -0.0 and infinities kept; a NaN stays a NaN); ``"n"``: None (an unused parameter);
    ``"c"``: cloned (a complex product is computed as complex: an infinite part times the
    scalar's 0 would make a NaN).
    """
    exact = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
    kinds = "".join(["n" if g is None else "f" if g.dtype in exact else "c" for g in grads])
    return [g for g, c in zip(grads, kinds) if c == "f"], kinds


class _CallState:
    """What a differentiable call's backward needs: its step, its call number, its rows."""

    __slots__ = ("bucket", "call", "n", "step", "trainer")

    def __init__(self, trainer: Trainer, step: _Step, call: int, n: int | None, bucket: int | None) -> None:
        self.trainer, self.step, self.call, self.n, self.bucket = trainer, step, call, n, bucket


def _flipped(seen: Any, now: Any) -> str:
    """The message for a call whose requires_grad pattern differs from the key's first."""
    for kind, a, b in (("input", seen[0], now[0]), ("parameter", seen[1], now[1])):
        for j, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return (
                    f"graphed(grad=True): {kind} {j} has requires_grad={y}, but it was {x} at this "
                    "key's first call in grad mode, which its backward graph was captured for: "
                    "keep requires_grad of each input and parameter fixed between calls, or use "
                    "another graphed callable (or close() this one) for the other pattern"
                )
    return "graphed(grad=True): the parameters changed since this key's first call in grad mode"


def _tensors(out: Any, torch: Any) -> list[Any]:
    leaves: list[Any] = []
    flatten(out, leaves)
    return [o for o in leaves if isinstance(o, torch.Tensor)]


_FUNCTION: list[Any] = []  # the autograd Function class, made once PyTorch is imported


def _function(torch: Any) -> Any:
    """The ``torch.autograd.Function`` a differentiable call applies (made on first use)."""
    if _FUNCTION:
        return _FUNCTION[0]

    class GraphedStep(torch.autograd.Function):  # type: ignore[misc]
        """A graphed call: its forward replayed already, its backward a graph."""

        @staticmethod
        def forward(ctx: Any, state: _CallState, token: Any, *tensors: Any) -> Any:
            ctx.state = state
            ctx.save_for_backward(token)  # (freed after a backward without retain_graph)
            return state.trainer.forward_outputs(ctx, state)

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            if torch.is_grad_enabled():
                raise RuntimeError(
                    "double backward (create_graph=True) through a graphed callable is not "
                    "supported: its backward is a captured graph, not differentiable again; "
                    "compute that part eagerly"
                )
            ctx.saved_tensors  # noqa: B018  (PyTorch refuses a second backward without retain_graph)
            state: _CallState = ctx.state
            return state.trainer.backward(state, grads, torch)

    _FUNCTION.append(GraphedStep)
    return GraphedStep
