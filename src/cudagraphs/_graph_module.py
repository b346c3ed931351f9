"""GraphModule: a graph-backed inference module whose parameters can be replaced safely.

A module's graphs read its parameters (weights) at the addresses they had
when captured. Replacing a parameter by a new array (a weight reload:
``module.weight = nn.Parameter(...)``, ``w.data = ...``, ``params["w"] = ...``)
leaves the graphs reading the old memory: PyTorch's graphs silently compute
with stale weights then, or read freed memory. A GraphModule checks its
parameters before every replay and refuses to replay after an unnoticed
replacement, or after a parameter was added
(:class:`~cudagraphs.StaleParameterError`); :meth:`GraphModule.refresh`
repoints the graphs' nodes at the new arrays (:meth:`cudagraphs.Graph.repoint`,
every replaced parameter at once), and drops the graphs to capture again
where a node's new address cannot be known (another library's node it cannot
see, memory two parameters share that only one of them moves) or where the
computation itself may change (a parameter added, a new shape or dtype).
The module keeps every parameter its graphs were captured with alive.
"""

from __future__ import annotations

import functools
import itertools
import operator
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from . import interop
from ._argtree import foreign_view_possible
from ._array import DeviceArray, foreign_view
from ._device import Device, Stream, StreamLike
from ._errors import StaleParameterError, UpdateError
from ._graphed_callable import GraphedCallable
from ._options import GraphedOptions
from ._pool import GraphPool

__all__ = ["GraphModule"]


class _Param(NamedTuple):
    """A parameter as the graphs saw it: how to read it now, and what it was."""

    name: str
    get: Callable[[], Any]
    obj: Any  # the array the graphs were captured (or last repointed) with
    ptr: int
    view: DeviceArray | None  # its memory then (kept alive: the graphs read it until refreshed)


def _address(obj: Any) -> int:
    if isinstance(obj, DeviceArray):
        return obj.ptr
    data_ptr = getattr(obj, "data_ptr", None)  # torch.Tensor, cheaply
    if data_ptr is not None:
        return int(data_ptr())
    view = foreign_view(obj, None)
    return -1 if view is None else view.ptr


class _Layout(NamedTuple):
    """What the dicts that hold the parameters held (see :meth:`GraphModule._relayout`)."""

    tables: list[dict[str, Any]]
    sizes: list[int]
    names: list[str]
    values: list[Any]


def _layout(tables: list[dict[str, Any]]) -> _Layout:
    chain = itertools.chain.from_iterable
    return _Layout(tables, list(map(len, tables)), list(chain(tables)), list(chain(map(dict.values, tables))))


def _same(tables: list[dict[str, Any]], then: _Layout) -> bool:
    """Whether ``tables`` are the dicts of ``then``, holding the same names, each the same object.

    (Loops in C: this runs before every replay.)
    """
    chain = itertools.chain.from_iterable
    return (
        len(tables) == len(then.tables)
        and all(map(operator.is_, tables, then.tables))
        and list(map(len, tables)) == then.sizes
        and all(map(operator.is_, chain(map(dict.values, tables)), then.values))
        and list(chain(tables)) == then.names
    )


class GraphModule:
    """A graph-backed inference module: ``forward`` stages the input, replays, returns the output.

    Three ways to make one:

    * ``cg.GraphModule(torch_module)``: a ``torch.nn.Module`` run in inference
      mode; its parameters and buffers are the module's;
    * ``cg.GraphModule(fn, params={"w": w, ...})``: ``fn(*inputs, **params)``;
      ``gm.params["w"] = new_w`` replaces one;
    * a subclass defining ``compute(self, *inputs)``; its parameters are the
      instance's attributes that are device arrays (``self.w = ...``).

    It graphs inference only (no gradients); to train a module through
    graphs, use ``cg.graphed(module, grad=True)`` (forward and backward
    graphs, ``.grad`` accumulated as eagerly: docs/graphed.md).

    Every other keyword is :func:`cudagraphs.graphed`'s (``buckets``, ``warmup``,
    ``pool``, ``stream``, ``mode``, ``copy_outputs``, ``pad_value``, ``device``,
    ``fallback``, ``generators``).

    Attributes
    ----------
    params : dict or None
        The parameters of the ``fn`` form (replace entries to reload weights).
    graphed : GraphedCallable
        The graphs, for inspection (``.graphs``, ``.stats()``).
    """

    # the module's own state lives in slots: a subclass's ``__dict__`` holds only its attributes
    # (looked at before every replay for parameters added)
    __slots__ = (
        "__dict__",
        "__weakref__",
        "_added",
        "_layout",
        "_module",
        "_seen",
        "_torch",
        "graphed",
        "params",
    )

    def __init__(
        self,
        module: Any = None,
        *,
        params: dict[str, Any] | None = None,
        buckets: Sequence[int] | None = None,
        dim: int = 0,
        warmup: int = 1,
        pool: GraphPool | None = None,
        stream: Stream | StreamLike | None = None,
        mode: str = "thread_local",
        copy_outputs: bool = False,
        pad_value: Any = 0,
        device: Device | int | None = None,
        fallback: str = "raise",
        generators: bool | Sequence[Any] | None = None,
    ) -> None:
        if module is not None and not callable(module):
            raise TypeError(f"GraphModule wraps a callable or a torch.nn.Module, got {type(module).__name__}")
        if module is None and type(self).compute is GraphModule.compute:
            raise TypeError(
                "GraphModule needs something to run: pass a torch.nn.Module or a function, or "
                "subclass it and define compute(self, *inputs)"
            )
        if params is not None:
            if module is None:
                raise TypeError("params= goes with a function: GraphModule(fn, params={...})")
            if not isinstance(params, dict) or not all(isinstance(k, str) for k in params):
                raise TypeError(f"params must be a dict of name -> array, got {type(params).__name__}")
        self._module = module
        self.params = dict(params) if params is not None else None
        self._torch = _is_torch_module(module)
        options = GraphedOptions.checked(
            buckets=buckets,
            dim=dim,
            warmup=warmup,
            pool=pool,
            stream=stream,
            mode=mode,
            copy_outputs=copy_outputs,
            pad_value=pad_value,
            device=device,
            fallback=fallback,
            generators=generators,
        )
        self.graphed = GraphedCallable(self._run, options)
        self._seen: list[_Param] | None = None  # parameters as the graphs use them
        self._layout = _layout([])  # see _relayout
        self._added: list[str] = []  # parameters the graphs have not seen

    def compute(self, *inputs: Any) -> Any:
        """The forward computation of a subclass (captured, then replayed)."""
        raise NotImplementedError

    def _run(self, *inputs: Any) -> Any:
        module = self._module
        if module is None:
            return self.compute(*inputs)
        if self._torch:
            with sys.modules["torch"].inference_mode():
                return module(*inputs)
        if self.params is not None:
            return module(*inputs, **self.params)
        return module(*inputs)

    # parameters ---------------------------------------------------------------------------
    def _readers(self) -> list[tuple[str, Callable[[], Any]]]:
        """(name, a function returning the parameter now) for every parameter."""
        if self._torch:
            out: list[tuple[str, Callable[[], Any]]] = []
            for prefix, sub in self._module.named_modules():
                for table in (sub._parameters, sub._buffers):
                    for name, value in table.items():
                        if value is not None:
                            full = f"{prefix}.{name}" if prefix else name
                            out.append((full, functools.partial(table.__getitem__, name)))
            return out
        if self.params is not None:
            params = self.params
            return [(k, functools.partial(params.__getitem__, k)) for k in params]
        return [
            (k, functools.partial(getattr, self, k))
            for k, v in vars(self).items()
            if not k.startswith("_") and k not in ("params", "graphed") and _is_param(v)
        ]

    def _tables(self) -> list[dict[str, Any]]:
        """The dicts that hold the parameters (and, for a torch module, its submodules)."""
        if self._torch:
            return [
                t for sub in self._module.modules() for t in (sub._parameters, sub._buffers, sub._modules)
            ]
        if self.params is not None:
            return [self.params]
        return [vars(self)]

    def _relayout(self) -> None:
        """Follow the tables that hold the parameters, cheaply unless one changed.

        A table that changed (an entry added, removed or replaced: a new
        ``params`` key, an attribute set from None, a submodule swapped) is
        read again in full: parameters the graphs have not seen are added to
        ``_added``, and each seen one is read through its holder now.
        """
        # (a torch module's dicts change in place: walking its modules again costs more)
        if _same(self._layout.tables if self._torch else self._tables(), self._layout):
            return
        assert self._seen is not None
        now = dict(self._readers())
        seen = {p.name for p in self._seen}
        self._added = [name for name in now if name not in seen]
        self._seen = [p._replace(get=now.get(p.name, _gone)) for p in self._seen]
        self._layout = _layout(self._tables())

    def parameters(self) -> dict[str, Any]:
        """The parameters by name, as they are now."""
        return {name: get() for name, get in self._readers()}

    def _stale(self) -> list[tuple[_Param, Any]]:
        """(parameter as the graphs use it, the array now) for every replaced parameter."""
        seen = self._seen
        if seen is None:
            return []
        out = []
        for p in seen:
            try:
                now = p.get()
            except (KeyError, AttributeError):
                now = None
            if now is not p.obj or _address(now) != p.ptr:
                out.append((p, now))
        return out

    def _snapshot(self) -> None:
        self._seen = [
            _Param(name, get, obj, _address(obj), _view(obj))
            for name, get in self._readers()
            for obj in (get(),)
        ]
        self._layout = _layout(self._tables())
        self._added = []

    # the call -----------------------------------------------------------------------------
    def forward(self, *inputs: Any) -> Any:
        """Stage the inputs, replay the graph for their shape (capturing it first), return the output.

        Raises
        ------
        StaleParameterError
            If a parameter was replaced or added since the graphs were
            captured and :meth:`refresh` was not called.
        """
        if self._seen is None:
            self._snapshot()
        else:
            self._relayout()
            stale = self._stale()
            if stale:
                names = ", ".join(repr(p.name) for p, _ in stale)
                raise StaleParameterError(
                    f"parameter(s) {names} of this GraphModule were replaced since its graphs "
                    "were captured, and the graphs still read the old memory: call refresh() "
                    "to point them at the new arrays (or to capture again)"
                )
            if self._added:
                names = ", ".join(map(repr, self._added))
                raise StaleParameterError(
                    f"parameter(s) {names} were added to this GraphModule since its graphs were "
                    "captured, and the graphs never read them: call refresh(), which drops the "
                    "graphs to capture them again on their next call"
                )
        return self.graphed(*inputs)

    __call__ = forward

    def refresh(self) -> dict[str, int]:
        """Point the graphs at replaced parameters; returns what was done.

        The replaced parameters that match the old ones (shape, strides,
        dtype, device) are repointed together in every graph
        (:meth:`cudagraphs.Graph.repoint`, no capture): each node's new
        arguments follow from the graph as it was, so parameters may
        exchange arrays (``m.a, m.b = m.b, m.a``). A graph is dropped, and
        captured again on its next call, where that cannot be done right:
        other libraries' nodes whose arguments cannot be changed, a node
        reading memory two parameters share while only one of them was
        replaced (``self.head = self.w[:4]``, then ``self.w`` reloaded: the
        graph must go on reading the old ``head``, as a new capture would).
        Every graph is dropped when a parameter changed shape or dtype, or a
        parameter was added (a new ``params`` key, an attribute set from
        None): the computation itself may change.

        Returns
        -------
        dict
            ``{"replaced": parameters, "added": parameters, "repointed":
            nodes changed, "recaptured": graphs dropped}``.
        """
        stale: list[tuple[_Param, Any]] = []
        if self._seen is not None:
            self._relayout()
            stale = self._stale()
        added = self._added
        report = {"replaced": len(stale), "added": len(added), "repointed": 0, "recaptured": 0}
        if not stale and not added:
            return report
        graphs = self.graphed._entries
        pairs = [(p.view, _view(now)) for p, now in stale]
        drop: set[Any] = set()
        if added or not all(_matches(old, new) for old, new in pairs):
            drop.update(graphs)
        else:
            replaced = {id(p) for p, _ in stale}
            assert self._seen is not None
            keep = [p.view for p in self._seen if id(p) not in replaced and p.view is not None]
            for key, entry in graphs.items():
                if entry.graph is None:  # (a key run eagerly reads the parameters as they are)
                    continue
                try:
                    report["repointed"] += entry.graph._repoint(pairs, keep)
                except UpdateError:  # a node whose new arguments cannot be known or set
                    drop.add(key)
        self.graphed._drop(drop)
        report["recaptured"] = len(drop)
        self._snapshot()
        return report

    def __repr__(self) -> str:
        what = type(self._module).__name__ if self._module is not None else type(self).__name__
        return f"<cudagraphs.GraphModule of {what}: {len(self.graphed._entries)} graphs>"


def _gone() -> None:
    """What a parameter that is no longer there reads as."""
    return None


def _matches(old: DeviceArray | None, new: DeviceArray | None) -> bool:
    """Whether ``new`` can take ``old``'s place in the graphs' nodes."""
    return (
        old is not None
        and new is not None
        and (old.shape, old.strides, old.dtype, old.device) == (new.shape, new.strides, new.dtype, new.device)
    )


def _view(obj: Any) -> DeviceArray | None:
    if obj is None:
        return None
    return obj if isinstance(obj, DeviceArray) else foreign_view(obj, None)


def _is_param(v: Any) -> bool:
    return isinstance(v, DeviceArray) or interop.library_of(v) is not None or foreign_view_possible(v)


def _is_torch_module(module: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(module, torch.nn.Module)
