"""cg.distributed: collectives between devices, eagerly and captured.

On ``sim`` with 2 and 4 simulated devices (CI); on ``cuda`` through NCCL
where the machine has two GPUs or more (``CUDAGRAPHS_TEST_BACKENDS=cuda,sim``,
nccl4py installed), in one process and in one process per GPU.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import cuda_device_count

import cudagraphs as cg
from cudagraphs import _recording
from cudagraphs import distributed as dist
from cudagraphs._pool import GraphPool
from cudagraphs.distributed import _nccl

REDUCE = {
    "sum": lambda a: np.sum(a, axis=0),
    "prod": lambda a: np.prod(a, axis=0),
    "max": lambda a: np.max(a, axis=0),
    "min": lambda a: np.min(a, axis=0),
    "avg": lambda a: np.mean(a, axis=0),
}


def _skip_without_nccl(backend: str) -> None:
    """On the cuda backend, skip (with the reason) where the ``nccl`` extra is not installed.

    An optional extra that is missing is a skip, never a failure; sim's
    collectives need nothing, so its tests always run.
    """
    if backend == "cuda" and not _nccl.available():
        pytest.skip(f"cg.distributed on GPUs needs nccl4py: {_nccl.INSTALL_HINT}")


def test_a_missing_nccl4py_skips_the_cuda_tests_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> Any:
        raise ModuleNotFoundError(f"No module named {name.split('.')[0]!r}")

    monkeypatch.setattr(_nccl.importlib, "import_module", missing)
    assert not _nccl.available()
    with pytest.raises(pytest.skip.Exception, match=re.escape(f"needs nccl4py: {_nccl.INSTALL_HINT}")):
        _skip_without_nccl("cuda")
    _skip_without_nccl("sim")  # sim's collectives need no extra: its tests run
    with pytest.raises(ImportError, match=re.escape(_nccl.INSTALL_HINT)):  # what the library says
        _nccl.NcclEngine()


# the shared fixtures, each skipped on cuda without nccl4py (sim's parametrizations run)
@pytest.fixture
def backend(backend: str) -> str:
    _skip_without_nccl(backend)
    return backend


@pytest.fixture
def devices(devices: list[cg.Device]) -> list[cg.Device]:
    _skip_without_nccl(devices[0].backend_name)
    return devices


@pytest.fixture
def group(devices: list[cg.Device]) -> Iterator[dist.LocalGroup]:
    g = dist.local_group(devices)
    yield g
    for d in devices:
        d.synchronize()
    g.close()


def _data(rng: np.random.Generator, n: int, shape: tuple[int, ...], dtype: str) -> list[np.ndarray]:
    if np.dtype(dtype).kind in "iu":
        return [rng.integers(1, 5, shape).astype(dtype) for _ in range(n)]
    return [rng.standard_normal(shape).astype(dtype) for _ in range(n)]


@pytest.mark.parametrize(
    ("op", "dtype"),
    [(op, dt) for op in REDUCE for dt in ("float32", "float64", "int32") if (op, dt) != ("avg", "int32")],
)
def test_all_reduce_matches_numpy(
    group: dist.LocalGroup, rng: np.random.Generator, op: str, dtype: str
) -> None:
    data = _data(rng, len(group), (7, 33), dtype)
    xs = [cg.asarray(v, device=d) for v, d in zip(data, group.devices)]
    outs = [cg.full((7, 33), -99, dtype, device=d) for d in group.devices]  # poisoned
    got = group.all_reduce(xs, outs, op=op)
    assert all(g is o for g, o in zip(got, outs))
    want = REDUCE[op](np.stack(data)).astype(dtype)
    for k, o in enumerate(outs):
        np.testing.assert_allclose(o.get(), want, rtol=1e-5, err_msg=f"rank {k}")
    for x, v in zip(xs, data):  # the inputs are untouched
        np.testing.assert_array_equal(x.get(), v)


def test_in_place_gather_scatter_and_broadcast(group: dist.LocalGroup, rng: np.random.Generator) -> None:
    n = len(group)
    data = _data(rng, n, (5, 3), "float32")
    xs = [cg.asarray(v, device=d) for v, d in zip(data, group.devices)]
    group.all_reduce(xs)  # in place by default
    for x in xs:
        np.testing.assert_allclose(x.get(), np.sum(data, axis=0), rtol=1e-5)
    xs = [cg.asarray(v, device=d) for v, d in zip(data, group.devices)]
    gathered = group.all_gather(xs)
    for g in gathered:
        assert g.shape == (n, 5, 3)
        np.testing.assert_array_equal(g.get(), np.stack(data))
    parts = [rng.standard_normal((n, 4)).astype(np.float32) for _ in range(n)]
    scattered = group.reduce_scatter(
        [cg.asarray(p, device=d) for p, d in zip(parts, group.devices)], op="max"
    )
    for r, s in enumerate(scattered):
        assert s.shape == (4,)
        np.testing.assert_array_equal(s.get(), np.max(np.stack(parts), axis=0)[r])
    root = n - 1
    outs = group.broadcast(
        xs, [cg.full((5, 3), np.nan, "float32", device=d) for d in group.devices], root=root
    )
    for o in outs:
        np.testing.assert_array_equal(o.get(), data[root])


def test_send_and_recv_in_a_ring(group: dist.LocalGroup) -> None:
    n = len(group)
    sent = [cg.asarray(np.arange(6, dtype=np.int64) + 100 * r, device=d) for r, d in enumerate(group.devices)]
    got = [cg.full(6, -1, "int64", device=d) for d in group.devices]
    with dist.group_calls():  # every rank sends and receives at once: one group
        for r, c in enumerate(group):
            c.send(sent[r], (r + 1) % n)
            c.recv(got[r], (r - 1) % n)
    for r, g in enumerate(got):
        np.testing.assert_array_equal(g.get(), np.arange(6) + 100 * ((r - 1) % n))


def test_one_capture_holds_every_devices_collectives(
    group: dist.LocalGroup, rng: np.random.Generator
) -> None:
    n, size = len(group), 1024  # 4 KiB of float32
    xs = [cg.zeros(size, "float32", device=d) for d in group.devices]
    for d in group.devices:
        d.synchronize()
    s = group.devices[0].create_stream()
    with cg.capture(stream=s) as g:
        for _ in range(20):
            group.all_reduce(xs, streams=[s] + [None] * (n - 1))  # the others fork into the capture
    for rep in range(3):
        data = [(rng.standard_normal(size) * 1e-3).astype(np.float32) for _ in range(n)]
        for x, v in zip(xs, data):
            x.set(v)
        g.replay(group.devices[0].current_stream())
        want = np.sum(data, axis=0) * n**19
        for k, x in enumerate(xs):
            np.testing.assert_allclose(x.get(), want, rtol=1e-3, err_msg=f"replay {rep}, rank {k}")
    g.close()


def test_a_graph_per_device(group: dist.LocalGroup, rng: np.random.Generator) -> None:
    n = len(group)
    xs = [cg.zeros(256, "float32", device=d) for d in group.devices]
    for d in group.devices:
        d.synchronize()
    streams = [d.create_stream() for d in group.devices]
    sessions = [cg.capture(stream=s) for s in streams]
    graphs = [ctx.__enter__() for ctx in sessions]
    try:
        group.all_reduce(xs, streams=streams)
        group.all_reduce(xs, op="max", streams=streams)
    finally:
        for ctx in reversed(sessions):
            ctx.__exit__(None, None, None)
    data = [rng.standard_normal(256).astype(np.float32) for _ in range(n)]
    for x, v, s in zip(xs, data, streams):
        x.set(v, stream=s)
    for g, s in zip(graphs, streams):
        g.replay(s)
    for x, s in zip(xs, streams):
        s.synchronize()
        np.testing.assert_allclose(x.get(stream=s), np.sum(data, axis=0), rtol=1e-5)


def test_a_graph_keeps_its_communicator(devices: list[cg.Device]) -> None:
    group = dist.local_group(devices)
    xs = [cg.ones(16, "float32", device=d) for d in devices]
    for d in devices:
        d.synchronize()
    s = devices[0].create_stream()
    with cg.capture(stream=s) as g:
        group.all_reduce(xs, streams=[s] + [None] * (len(devices) - 1))
    del group  # the graph holds the communicators
    gc.collect()
    _recording.drain()  # (where the releases that collections queue run)
    g.replay(devices[0].current_stream())
    assert (xs[-1].get() == len(devices)).all()
    g.close()


def test_argument_errors(group: dist.LocalGroup) -> None:
    d0, d1 = group.devices[0], group.devices[1]
    c0 = group[0]
    x = cg.zeros(8, "float32", device=d0)
    with pytest.raises(ValueError, match=r"is on .*rank 0.s communicator is on"):
        c0.all_reduce(cg.zeros(8, "float32", device=d1))
    with pytest.raises(ValueError, match="contiguous"):
        c0.all_reduce(cg.zeros((8, 2), "float32", device=d0)[:, 0])
    with pytest.raises(TypeError, match="collectives take"):
        c0.all_reduce(cg.zeros(8, "complex64", device=d0))
    with pytest.raises(TypeError, match="DeviceArray"):
        c0.all_reduce(np.zeros(8, np.float32))
    with pytest.raises(ValueError, match="op must be one of"):
        c0.all_reduce(x, op="mean")
    with pytest.raises(ValueError, match=r"shape \(4,\); this operation writes \(8,\)"):
        c0.all_reduce(x, cg.zeros(4, "float32", device=d0))
    with pytest.raises(TypeError, match="is int32 but the input is float32"):
        c0.all_reduce(x, cg.zeros(8, "int32", device=d0))
    with pytest.raises(IndexError, match="not a rank"):
        c0.broadcast(x, root=len(group))
    with pytest.raises(ValueError, match="to itself"):
        c0.send(x, 0)
    with pytest.raises(ValueError, match=r"shape \(size, \.\.\.\)"):
        c0.reduce_scatter(cg.zeros(len(group) + 1, "float32", device=d0))
    with pytest.raises(ValueError, match="entries; the group has"):
        group.all_reduce([x])
    with pytest.raises(TypeError, match="list of arrays"):
        group.all_reduce(x)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        c0.synchronize(timeout=0)
    with pytest.raises(TypeError, match="devices must be"):
        dist.local_group([])


def test_a_groups_ranks_that_disagree_are_refused_at_the_call(
    group: dist.LocalGroup, rng: np.random.Generator
) -> None:
    n, last = len(group), len(group) - 1
    data = [rng.standard_normal(8).astype(np.float32) for _ in range(n)]
    xs = [cg.asarray(v, device=d) for v, d in zip(data, group.devices)]
    short = [*xs[:last], cg.asarray(data[last][:4], device=group.devices[last])]  # the last rank's
    for call, kind in (
        (lambda: group.all_reduce(short), "all_reduce(%d float32, sum)"),
        (lambda: group.all_gather(short), "all_gather(%d float32)"),
        (lambda: group.broadcast(short, root=0), "broadcast(%d float32, root 0)"),
    ):
        with pytest.raises(ValueError, match=re.escape(f"rank {last}: {kind % 4}")) as err:
            call()
        assert f"rank 0: {kind % 8}, " in str(err.value)
        assert "same size and dtype" in str(err.value)
    parts = [
        cg.asarray(rng.standard_normal((n, 3 if r == 0 else 2)).astype(np.float32), device=d)
        for r, d in enumerate(group.devices)
    ]
    with pytest.raises(ValueError, match=re.escape("rank 0: reduce_scatter(3 float32, sum), rank 1: ")):
        group.reduce_scatter(parts)
    ints = [*xs[:last], cg.asarray(data[last].astype(np.int32), device=group.devices[last])]
    with pytest.raises(TypeError, match=re.escape(f"rank {last}: all_reduce(8 int32, sum)")):
        group.all_reduce(ints)
    for d in group.devices:  # nothing was issued: no error waits in a stream
        d.synchronize()
    for x, v in zip(xs, data):
        np.testing.assert_array_equal(x.get(), v)
    group.all_reduce(xs)  # the group goes on: its ranks still meet
    for x in xs:
        np.testing.assert_allclose(x.get(), np.sum(data, axis=0), rtol=1e-5)


def test_a_group_call_refused_inside_a_capture_leaves_the_capture_usable(group: dist.LocalGroup) -> None:
    n = len(group)
    xs = [cg.ones(8, "float32", device=d) for d in group.devices]
    short = [*xs[:-1], cg.ones(4, "float32", device=group.devices[-1])]
    for d in group.devices:
        d.synchronize()
    s = group.devices[0].create_stream()
    with cg.capture(stream=s) as g:  # (the other ranks fork into it, then join it back)
        with pytest.raises(ValueError, match="the ranks' arrays differ"):
            group.all_reduce(short, streams=[s] + [None] * (n - 1))
        group.all_reduce(xs, streams=[s] + [None] * (n - 1))
    for x in xs:
        x.set(np.arange(8, dtype=np.float32))
    g.replay(group.devices[0].current_stream())
    for x in xs:
        np.testing.assert_array_equal(x.get(), np.arange(8) * n)
    g.close()


# what only the simulator can check (on a GPU: a hang, or corrupt memory) --------------------------
@pytest.fixture
def sim_group() -> Iterator[dist.LocalGroup]:
    with cg.override(backend="sim", sim_devices=2):
        devs = [cg.Device(0), cg.Device(1)]
        g = dist.local_group(devs)
        for d in devs:
            d.synchronize()
        yield g
        g.abort()  # (what a test left stopped goes on; what it left raising raises here)
        for _ in range(3):
            for d in devs:
                with contextlib.suppress(cg.DistributedError):
                    d.synchronize()


def _errors(devices: list[cg.Device]) -> list[str]:
    """The errors that synchronizing every device, three times over, raises."""
    errors = []
    for _ in range(3):
        for d in devices:
            try:
                d.synchronize()
            except cg.DistributedError as exc:
                errors.append(str(exc))
    return errors


def test_sim_ranks_that_disagree_raise_once(sim_group: dist.LocalGroup) -> None:
    d0, d1 = sim_group.devices
    with dist.group_calls():  # (each rank's own call: only the streams can compare them)
        sim_group[0].all_reduce(cg.zeros(8, "float32", device=d0))
        sim_group[1].all_reduce(cg.zeros(4, "float32", device=d1))
    errors = _errors([d0, d1])  # one error, not one per rank's stream (in a later call)
    assert len(errors) == 1, errors
    assert "rank 0: all_reduce(8 float32, sum), rank 1: all_reduce(4 float32, sum)" in errors[0]
    xs = [cg.asarray(np.array([1.5, -2.0], np.float32) * (r + 1), device=d) for r, d in enumerate((d0, d1))]
    sim_group.all_reduce(xs)  # the ranks still meet
    for x in xs:
        np.testing.assert_array_equal(x.get(), [4.5, -6.0])


def test_sim_a_rank_that_never_joins_times_out_and_abort_frees_the_stream(sim_group: dist.LocalGroup) -> None:
    d0 = sim_group.devices[0]
    x = cg.ones(8, "float32", device=d0)
    sim_group[0].all_reduce(x)
    with pytest.raises(cg.CollectiveTimeoutError, match=r"rank\(s\) \[1\] to join all_reduce"):
        sim_group[0].synchronize(timeout=5)
    assert sim_group[0].closed  # aborted
    d0.synchronize()  # the stopped stream went on (its result unwritten)
    assert (x.get() == 1).all()
    with pytest.raises(ValueError, match="closed"):
        sim_group.all_reduce([x, cg.ones(8, "float32", device=sim_group.devices[1])])


def test_sim_a_send_and_its_recv_must_match(sim_group: dist.LocalGroup) -> None:
    d0, d1 = sim_group.devices
    with dist.group_calls():
        sim_group[0].send(cg.zeros(8, "float32", device=d0), 1)
        sim_group[1].recv(cg.zeros(8, "int32", device=d1), 0)
    errors = _errors([d1, d0])
    assert len(errors) == 1, errors
    assert "sends 8 float32 to rank 1, which receives 8 int32" in errors[0]


def test_sim_an_ungrouped_exchange_deadlocks_as_on_a_gpu(sim_group: dist.LocalGroup) -> None:
    d0, d1 = sim_group.devices
    a0, a1 = cg.zeros(4, "float32", device=d0), cg.zeros(4, "float32", device=d1)
    sim_group[0].send(a0, 1)  # each rank sends first, then receives: both wait forever
    sim_group[1].send(a1, 0)
    sim_group[0].recv(a0, 1)
    sim_group[1].recv(a1, 0)
    with pytest.raises(cg.CollectiveTimeoutError, match="send"):
        d0.synchronize()
    sim_group.abort()
    d0.synchronize()
    d1.synchronize()


def test_outputs_made_inside_one_capture_come_from_its_pool_on_every_device(
    group: dist.LocalGroup, rng: np.random.Generator
) -> None:
    # all_gather and reduce_scatter without outs allocate each rank's output inside the capture,
    # on the stream that rank runs on (a forked one: the graph's pool of its device)
    n, devs = len(group), group.devices
    data = _data(rng, n, (n, 6), "float32")
    xs = [cg.asarray(v, device=d) for v, d in zip(data, devs)]
    for d in devs:
        d.allocator.empty_cache()  # (no cached block: each output is a new allocation)
        d.synchronize()
    s = devs[0].create_stream()
    s.wait(devs[0].current_stream())
    with cg.capture(stream=s) as g:
        gathered = group.all_gather(xs, streams=[s] + [None] * (n - 1))
        parts = group.reduce_scatter(xs, streams=[s] + [None] * (n - 1))
    for r, d in enumerate(devs):
        for out in (gathered[r], parts[r]):
            assert out.device is d
            assert isinstance(out._block.owner, GraphPool), out._block.owner  # not the eager cache
    g.replay(s)
    s.synchronize()
    for r in range(n):
        np.testing.assert_array_equal(gathered[r].get(), np.stack(data))
        np.testing.assert_allclose(parts[r].get(), np.sum(data, axis=0)[r], rtol=1e-5)
    g.close()


@pytest.mark.parametrize("nbytes", [4 << 10, 16 << 20])
def test_a_new_groups_first_collective_may_be_captured(
    devices: list[cg.Device], rng: np.random.Generator, nbytes: int
) -> None:
    # (NCCL connects an algorithm on its first use, which a capture refuses: the warm-up at
    # creation must leave nothing to connect, whatever size is captured first)
    group = dist.local_group(devices)
    data = [rng.standard_normal(nbytes // 4).astype(np.float32) for _ in devices]
    xs = [cg.asarray(v, device=d) for v, d in zip(data, devices)]
    for d in devices:
        d.synchronize()
    s = devices[0].create_stream()
    with cg.capture(stream=s) as g:
        group.all_reduce(xs, streams=[s] + [None] * (len(devices) - 1))
    g.replay(devices[0].current_stream())
    group.synchronize(timeout=60)
    for x in xs:
        np.testing.assert_allclose(x.get(), np.sum(data, axis=0), rtol=1e-5, atol=1e-5)
    g.close()
    group.close()


# one rank per call of init(): the store ------------------------------------------------------------
def test_init_waits_for_every_rank(device: cg.Device, own_tmp: Path) -> None:
    # rank 1 never starts: rank 0's init times out instead of hanging (NCCL's and sim's alike)
    store = dist.FileStore(own_tmp / "store")
    t0 = time.monotonic()
    with pytest.raises(cg.CollectiveTimeoutError, match="rank"):
        dist.init(0, 2, store=store, device=device, timeout=0.5)
    # (a bound far from any speed: NCCL's setup under compute-sanitizer with 13 processes on
    # one H100 took 33 s, alone 24 s; without the timeout it waits for ever)
    assert time.monotonic() - t0 < 240
    assert _mailboxes(own_tmp) == []  # (sim: no mailbox left)
    # nothing is left behind: the device works, and the same store makes another communicator
    x = cg.ones(4, "float32", device=device)
    cg.ops.scale(2.0, x, out=x)
    assert (x.get() == 2).all()
    comm = dist.init(0, 1, store=store, device=device, name="again")
    comm.all_reduce(x)
    assert (x.get() == 2).all()
    comm.close()


def test_sim_refuses_two_ranks_of_one_communicator_in_one_process(own_tmp: Path) -> None:
    # on sim, init() is one rank per process (a thread per rank would share one simulator)
    with cg.override(backend="sim", sim_devices=2):
        store = dist.FileStore(own_tmp / "store")
        errors: list[BaseException] = []

        def rank0() -> None:
            try:
                dist.init(0, 2, store=store, device=cg.Device(0), timeout=2)
            except BaseException as exc:  # (checked below)
                errors.append(exc)

        boxes = own_tmp / "tmp" / "cudagraphs-sim"
        t = threading.Thread(target=rank0)
        t.start()
        deadline = time.monotonic() + 10
        while not list(boxes.glob("*/joined.0")):
            assert time.monotonic() < deadline, "rank 0 never joined"
            time.sleep(0.01)
        with pytest.raises(cg.DistributedError, match="one rank per process"):
            dist.init(1, 2, store=store, device=cg.Device(1), timeout=2)
        t.join()
        assert len(errors) == 1
        assert isinstance(errors[0], cg.CollectiveTimeoutError)
        assert "rank(s) [1] to join" in str(errors[0])


def test_init_argument_and_store_errors(tmp_path: Path, backend: str) -> None:
    """Bad arguments are refused before the engine is loaded; a rank 0 that never comes times out.

    (On cuda without nccl4py the ``backend`` fixture skips: the timeout needs the engine.)
    """
    store = dist.FileStore(tmp_path, timeout=0.2)
    with pytest.raises(IndexError, match=r"rank 2 is not in 0\.\.1"):
        dist.init(2, 2, store=store)
    with pytest.raises(ValueError, match="world_size must be at least 1"):
        dist.init(0, 0, store=store)
    with pytest.raises(TypeError, match="rank must be an int"):
        dist.init("0", 2, store=store)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"set\(key, value\) and get\(key\)"):
        dist.init(1, 2, store=object())
    with pytest.raises(cg.CollectiveTimeoutError, match="start the rank that publishes it"):
        dist.init(1, 2, store=store)  # rank 0 never comes
    with pytest.raises(ValueError, match="positive"):
        dist.FileStore(tmp_path, timeout=0)


# one process per GPU (on sim: per simulated GPU) ------------------------------------------------
_RANK = textwrap.dedent(
    """
    import sys, tempfile, numpy as np, cudagraphs as cg
    from pathlib import Path
    from cudagraphs import distributed as dist
    rank, path, mode, n = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    store = dist.FileStore(path)
    comm = dist.init(rank, n, store=store, device=cg.Device(rank), timeout=4 if mode == "block" else 30)
    d = comm.device
    if mode in ("late", "block") and rank == 1:
        sys.exit(0)  # joined, then never calls the collective
    if mode == "abort" and rank == 1:
        store.get("queued")  # once rank 0 has two operations waiting for this rank
        comm.abort()
        sys.exit(0)
    x = cg.asarray(np.arange(1024, dtype=np.float32) * (rank + 1), device=d)
    if mode == "disagree":
        try:
            comm.all_reduce(x[: 1024 - 512 * rank])  # rank 1 sends half as much
            comm.synchronize(timeout=10)
        except cg.DistributedError as exc:
            print("DISAGREE", type(exc).__name__, exc)
            sys.exit(0)
        sys.exit(1)
    comm.all_reduce(x)
    if mode == "block":
        try:
            x.get()  # waits as long as the communicator's timeout (4 s), then raises
        except cg.CollectiveTimeoutError as exc:
            print("TIMEOUT", exc)
            sys.exit(0)
        sys.exit(1)
    if mode == "late":
        try:
            comm.synchronize(timeout=3)
        except cg.CollectiveTimeoutError as exc:
            print("TIMEOUT", exc)
            sys.exit(0)
        sys.exit(1)
    if mode == "abort":  # rank 1 aborted: every operation waiting for it raises
        s2 = d.create_stream()
        x2 = cg.ones(4, "float32", device=d, stream=s2)
        comm.all_reduce(x2, stream=s2)
        store.set("queued", b"1")
        raised = []
        for arr, st in ((x, None), (x2, s2)):
            try:
                arr.get(stream=st)
            except cg.DistributedError as exc:
                raised.append(str(exc))
        print("ABORTED", len(raised), raised[:1])
        sys.exit(0)
    total = n * (n + 1) // 2  # (the ranks' rank + 1, summed)
    assert (x.get() == np.arange(1024) * total).all(), x.get()[:4]
    s = d.create_stream()
    y = cg.zeros(1024, "float32", device=d)
    d.synchronize()
    with cg.capture(stream=s) as g:
        for _ in range(10):
            comm.all_reduce(y, stream=s)
    y.set(np.full(1024, rank + 1, np.float32), stream=s)
    g.replay(s)
    s.synchronize()
    assert (y.get(stream=s) == total * n**9).all(), y.get(stream=s)[:4]
    out = comm.all_gather(cg.full(4, rank, "int32", device=d))
    assert (out.get() == np.repeat(np.arange(n), 4).reshape(n, 4)).all()
    a = cg.full(8, rank + 5, "float64", device=d)
    b = cg.zeros(8, "float64", device=d)
    with dist.group_calls():  # a ring: to the next rank, from the previous one
        comm.send(a, (rank + 1) % n)
        comm.recv(b, (rank - 1) % n)
    assert (b.get() == (rank - 1) % n + 5).all(), b.get()
    if cg.backend() == "sim":  # what was sent to this rank was removed once read
        comm.synchronize(timeout=30)
        left = list((Path(tempfile.gettempdir()) / "cudagraphs-sim").glob(f"*/*-*.*-{rank}"))
        assert not left, left
    print("RANK OK", rank)
    comm.close()
    """
)

_PROCESS_BACKENDS = [
    "sim",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(
            cuda_device_count() < 2, reason="GPU test: needs two GPUs and CUDAGRAPHS_TEST_BACKENDS=cuda,sim"
        ),
    ),
]


@pytest.fixture
def own_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary directory of the test's own for sim's mailboxes (forked children's too), as _ranks'."""
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    return tmp_path


def _mailboxes(tmp_path: Path) -> list[Path]:
    """The sim mailboxes left in the temporary directory of :func:`_ranks` run in ``tmp_path``."""
    root = tmp_path / "tmp" / "cudagraphs-sim"
    return sorted(root.iterdir()) if root.is_dir() else []


def _ranks(tmp_path: Path, backend: str, mode: str, n: int = 2, script: str = _RANK) -> list[str]:
    """Run ``script`` as ranks ``0..n-1``, one process each (argv: rank, store, mode, n); their output."""
    _skip_without_nccl(backend)  # (a parametrized backend: the fixture's skip does not see it)
    (tmp_path / "tmp").mkdir(parents=True, exist_ok=True)
    path = tmp_path / "rank.py"
    path.write_text(script)
    env = {**os.environ, "CUDAGRAPHS_BACKEND": backend, "CUDAGRAPHS_SIM_DEVICES": str(n)}
    # sim's mailboxes go to the test's own temporary directory: runs of other tests or
    # sessions at the same time (or a killed one's leftovers) are not seen, nor see these
    env["TMPDIR"] = str(tmp_path / "tmp")
    procs = [
        subprocess.Popen(
            [sys.executable, str(path), str(r), str(tmp_path / "store"), mode, str(n)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(n)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {r}:\n{out}"
    return outs


@pytest.mark.parametrize("backend", _PROCESS_BACKENDS)
def test_one_process_per_gpu(tmp_path: Path, backend: str) -> None:
    outs = _ranks(tmp_path, backend, "ok")
    assert all(f"RANK OK {r}" in out for r, out in enumerate(outs)), outs


def test_four_processes_on_sim(tmp_path: Path) -> None:
    outs = _ranks(tmp_path, "sim", "ok", n=4)
    assert all(f"RANK OK {r}" in out for r, out in enumerate(outs)), outs


@pytest.mark.parametrize("backend", _PROCESS_BACKENDS)
def test_one_process_per_gpu_rank_that_never_calls(tmp_path: Path, backend: str) -> None:
    out = _ranks(tmp_path, backend, "late")[0]
    assert "TIMEOUT" in out, out
    assert "aborted" in out, out


def test_one_process_per_gpu_errors_on_sim(tmp_path: Path) -> None:
    # where a GPU hangs or corrupts memory, sim's processes raise, each naming the ranks' calls
    for r, out in enumerate(_ranks(tmp_path / "disagree", "sim", "disagree")):
        assert "DISAGREE DistributedError" in out, out
        assert "rank 0: all_reduce(1024 float32, sum), rank 1: all_reduce(512 float32, sum)" in out, (r, out)
    out = _ranks(tmp_path / "abort", "sim", "abort")[0]
    assert "ABORTED 2" in out, out
    assert "rank 1 (another process) aborted the communicator" in out, out
    t0 = time.monotonic()
    out = _ranks(tmp_path / "block", "sim", "block")[0]
    assert "TIMEOUT" in out, out
    assert "waited 4 s for rank(s) [1] to join all_reduce(1024 float32, sum)" in out, out
    assert "rank(s) [1] closed their communicator" in out, out
    assert time.monotonic() - t0 < 60
    # every run's mailbox was removed by the last of its ranks to leave
    assert [_mailboxes(tmp_path / run) for run in ("disagree", "abort", "block")] == [[], [], []]


def _forked_rank(rank: int, path: str) -> None:
    with cg.override(backend="sim", sim_devices=2):
        comm = dist.init(rank, 2, store=dist.FileStore(path), device=cg.Device(rank), timeout=30)
        x = cg.full(8, rank + 1, "float32", device=comm.device)
        comm.all_reduce(x)
        assert (x.get() == 3).all()
        # (no close: the child ends through os._exit, which runs no atexit handler)


_MISMATCH = textwrap.dedent(
    """
    import sys, cudagraphs as cg
    from cudagraphs import distributed as dist
    rank, path = int(sys.argv[1]), sys.argv[2]
    try:  # rank 0 says 2 ranks, rank 1 says 3
        dist.init(rank, 2 + rank, store=dist.FileStore(path), device=cg.Device(rank), timeout=3)
    except cg.DistributedError as exc:
        print("REFUSED", exc)
    """
)


def test_ranks_that_disagree_on_the_world_size_are_refused_on_sim(tmp_path: Path) -> None:
    outs = _ranks(tmp_path, "sim", "", script=_MISMATCH)
    assert "REFUSED sim: rank 0 joins with a world size of 2, but rank(s) [1] joined with [3]" in outs[0], (
        outs
    )
    assert "REFUSED sim: rank 1 joins with a world size of 3, but rank(s) [0] joined with [2]" in outs[1], (
        outs
    )
    assert _mailboxes(tmp_path) == []  # (the last to leave removed it)


def test_ranks_in_multiprocessing_children_leave_no_mailbox(own_tmp: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_forked_rank, args=(r, str(own_tmp / "store"))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert _mailboxes(own_tmp) == []


@pytest.mark.parametrize("backend", _PROCESS_BACKENDS)
def test_the_per_process_example_of_the_docs_runs(tmp_path: Path, backend: str) -> None:
    text = (Path(__file__).parent.parent / "docs" / "distributed.md").read_text()
    start = text.index("# rank.py: python rank.py 0")
    script = text[start : text.index("```", start)].replace("/tmp/job-42", str(tmp_path / "store"))
    outs = _ranks(tmp_path, backend, "", script=script)
    assert all("[6. 6. 6. 6.]" in out for out in outs), outs


def test_integer_average_truncates_toward_zero(devices: list[cg.Device]) -> None:
    group = dist.local_group(devices[:2])
    vals = [np.array([1, -2, 7, -7, 3], np.int32), np.array([-2, 1, 0, 0, 4], np.int32)]
    xs = [cg.asarray(v, device=d) for v, d in zip(vals, group.devices)]
    group.all_reduce(xs, op="avg")
    group.synchronize(timeout=30)
    want = np.trunc((vals[0] + vals[1]) / 2).astype(np.int32)  # [0, 0, 3, -3, 3]: C's division
    for x in xs:
        np.testing.assert_array_equal(x.get(), want)
    group.close()


# the data-parallel step of the benchmark -----------------------------------------------------------
def test_data_parallel_step_matches_numpy(devices: list[cg.Device], monkeypatch: pytest.MonkeyPatch) -> None:
    from cudagraphs.bench.multigpu import dp_step

    cg.enable_peer_access(devices)
    r = dp_step(devices, 3, batch=8, d=16, h=32)
    assert r["ok"], r
    assert r["eager"] > 0
    assert r["graph"] > 0
    # without the gradients' all-reduce each device trains on its shard alone: caught
    monkeypatch.setattr(dist.LocalGroup, "all_reduce", lambda self, xs, *a, **k: list(xs))
    assert not dp_step(devices, 3, batch=8, d=16, h=32)["ok"]


def test_bench_ratios_are_the_issue_comparisons() -> None:
    from cudagraphs.bench.multigpu import _ratios

    rows = {
        "cudagraphs graph": {4096: 6.6},
        "cudagraphs graph (one per GPU)": {4096: 6.0},
        "nccl4py graph (bare)": {4096: 6.0},
        "torch.distributed eager": {4096: 33.0},
    }
    assert _ratios(rows, 4096) == [
        "4 KiB, cudagraphs graph: 1.10x the bare nccl4py graph's time, 5.0x faster than "
        "torch.distributed eager",
        "4 KiB, cudagraphs graph (one per GPU): 1.00x the bare nccl4py graph's time, 5.5x faster than "
        "torch.distributed eager",
    ]
    assert _ratios({"cudagraphs graph": {4096: 6.6}}, 4096) == []  # (nothing to compare with)


@pytest.mark.parametrize(("sim_devices", "used"), [("1", 2), ("3", 3)])  # (one is raised to two)
def test_bench_devices_cli_on_sim(sim_devices: str, used: int) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "cudagraphs", "bench", "--devices"],
        capture_output=True,
        text=True,
        timeout=300,  # (the count is the test's, whatever CUDAGRAPHS_SIM_DEVICES the suite runs with)
        env={**os.environ, "CUDAGRAPHS_BACKEND": "sim", "CUDAGRAPHS_SIM_DEVICES": sim_devices},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"data-parallel MLP step ({used} devices)" in r.stdout
    assert f"all-reduce, us per call ({used} devices" in r.stdout
    assert "ok (against numpy" in r.stdout
    assert "cudagraphs graph" in r.stdout


# one rank: every backend, one device (on a GPU: NCCL's calls, its capture, its non-blocking init)
def test_a_communicator_of_one_rank(device: cg.Device, rng: np.random.Generator, tmp_path: Path) -> None:
    group = dist.local_group([device])
    last_error = getattr(group[0].engine, "_last_error", None)
    if last_error is not None:  # NCCL: its last error reads (the text NCCL gives an error with)
        assert "could not be read" not in last_error()
    v = rng.standard_normal((3, 5)).astype(np.float32)
    x = cg.asarray(v, device=device)
    out = cg.full((3, 5), np.nan, "float32", device=device)
    group.all_reduce([x], [out], op="max")
    np.testing.assert_array_equal(out.get(), v)
    (g,) = group.all_gather([x])
    assert g.shape == (1, 3, 5)
    np.testing.assert_array_equal(g.get()[0], v)
    (r,) = group.reduce_scatter([cg.asarray(v[None], device=device)])
    np.testing.assert_array_equal(r.get(), v)
    s = device.create_stream()
    y = cg.zeros(256, "float32", device=device)
    device.synchronize()
    with cg.capture(stream=s) as graph:
        for _ in range(5):
            group.all_reduce([y], streams=[s])
            cg.ops.scale(2.0, y, out=y, stream=s)
    y.set(np.ones(256, np.float32), stream=s)
    graph.replay(s)
    s.synchronize()
    np.testing.assert_array_equal(y.get(stream=s), np.full(256, 32.0))
    graph.close()
    group.close()
    comm = dist.init(0, 1, store=dist.FileStore(tmp_path), device=device, name="one")
    z = cg.asarray(v, device=device)
    o = comm.broadcast(z, cg.zeros((3, 5), "float32", device=device))
    comm.synchronize(timeout=30)
    np.testing.assert_array_equal(o.get(), v)
    comm.close()


# other libraries' arrays (torch, CuPy): used in place, returned as given -------------------------
class _Foreign:
    """Another library's CUDA array, as far as cudagraphs can tell (it speaks CAI)."""

    def __init__(self, a: cg.DeviceArray) -> None:
        self.a = a

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.a.shape, "typestr": self.a.dtype.str, "data": (self.a.ptr, False), "version": 3}


def test_collectives_refuse_what_is_not_a_device_array(device: cg.Device) -> None:
    group = dist.local_group([device])
    with pytest.raises(TypeError, match=r"x must be a device array .* got ndarray; copy host data"):
        group.all_reduce([np.ones(4, np.float32)])
    if not device.backend.capabilities.shares_memory:  # sim: real GPU memory is out of reach
        with pytest.raises(TypeError, match="in real GPU memory, which the sim backend cannot read"):
            group[0].all_reduce(_Foreign(cg.ones(4, "float32", device=device)))
    group.close()


def _gpu(device: cg.Device) -> None:
    if not device.backend.capabilities.shares_memory:
        pytest.skip("GPU test: torch and CuPy arrays live in real GPU memory")


def test_torch_and_cupy_arrays_in_place_eager_and_captured(
    device: cg.Device, rng: np.random.Generator
) -> None:
    _gpu(device)
    torch = pytest.importorskip("torch")
    cp = pytest.importorskip("cupy")
    group = dist.local_group([device])
    comm = group[0]
    v = rng.standard_normal((4, 8)).astype(np.float32)
    t = torch.from_numpy(v).to(f"cuda:{device.index}")
    torch.cuda.synchronize(device.index)  # (torch's stream before ours)
    assert comm.all_reduce(t, op="max") is t  # in place, returned as given
    g = torch.full((1, 4, 8), float("nan"), device=f"cuda:{device.index}")
    assert comm.all_gather(t, g) is g
    c = cp.zeros((4, 8), dtype=cp.float32)
    assert comm.broadcast(t, c, root=0) is c
    device.synchronize()
    np.testing.assert_array_equal(t.cpu().numpy(), v)
    np.testing.assert_array_equal(g.cpu().numpy()[0], v)
    np.testing.assert_array_equal(cp.asnumpy(c), v)
    # captured: the graph replays on the tensor's memory
    y = torch.ones(256, device=f"cuda:{device.index}")
    s = device.create_stream()
    torch.cuda.synchronize(device.index)
    with cg.capture(stream=s) as graph:
        for _ in range(3):
            comm.all_reduce(y, stream=s)
            cg.ops.scale(2.0, cg.asarray(y), out=cg.asarray(y), stream=s)
    graph.replay(s)
    graph.replay(s)
    s.synchronize()
    np.testing.assert_array_equal(y.cpu().numpy(), np.full(256, 64.0))
    graph.close()
    group.close()


def test_torch_tensors_on_every_gpu(devices: list[cg.Device], rng: np.random.Generator) -> None:
    _gpu(devices[0])
    torch = pytest.importorskip("torch")
    group = dist.local_group(devices)
    data = [rng.standard_normal(1000).astype(np.float32) for _ in devices]
    ts = [torch.from_numpy(v).to(f"cuda:{d.index}") for v, d in zip(data, devices)]
    for d in devices:  # (torch's copies on each device before ours)
        torch.cuda.synchronize(d.index)
    outs = group.all_reduce(ts, op="avg")
    assert all(o is t for o, t in zip(outs, ts))
    group.synchronize(timeout=30)
    for t in ts:
        np.testing.assert_allclose(t.cpu().numpy(), np.mean(data, axis=0), rtol=1e-5, atol=1e-6)
    group.close()


def test_graphs_of_an_aborted_communicator_refuse_to_replay(device: cg.Device) -> None:
    # NCCL's abort frees what the graph's collective nodes use: a replay would fault the GPU
    group = dist.local_group([device])
    s = device.create_stream()
    y = cg.ones(64, "float32", device=device, stream=s)
    with cg.capture(stream=s) as g:
        group.all_reduce([y], streams=[s])
        cg.ops.scale(2.0, y, out=y, stream=s)
    with cg.capture(stream=s) as outer:  # embeds g: unusable with it
        g.replay(s)
        cg.ops.scale(2.0, y, out=y, stream=s)
    with cg.capture(stream=s) as plain:  # no collective: unaffected
        cg.ops.scale(3.0, y, out=y, stream=s)
    g.replay(s)
    outer.replay(s)
    s.synchronize()
    assert (y.get(stream=s) == 8).all()
    group.abort()
    for graph in (g, outer):
        with pytest.raises(cg.DistributedError, match="was aborted: its collectives cannot run"):
            graph.replay(s)
        with pytest.raises(cg.DistributedError, match="was aborted"):
            graph.upload(s)
    plain.replay(s)
    s.synchronize()
    assert (y.get(stream=s) == 24).all()  # nothing of the refused replays ran
    for graph in (g, outer, plain):
        graph.close()


def test_one_group_cannot_mix_a_local_group_and_an_init_communicator(
    device: cg.Device, tmp_path: Path
) -> None:
    group = dist.local_group([device])
    comm = dist.init(0, 1, store=dist.FileStore(tmp_path), device=device, name="mix")
    x, y = cg.ones(8, "float32", device=device), cg.ones(8, "float32", device=device)
    with (
        pytest.raises(cg.DistributedError, match="cannot hold operations of a local_group"),
        dist.group_calls(),
    ):
        group.all_reduce([x])
        comm.all_reduce(y)
    group.synchronize(timeout=30)
    comm.all_reduce(y)  # each in a block (or none) of its own works
    with dist.group_calls():
        group.all_reduce([x])
    comm.synchronize(timeout=30)
    assert (x.get() == 1).all()
    assert (y.get() == 1).all()
    comm.close()
    group.close()


# the simulator's scheduling (found in review: each of these failed once) ------------------------
def test_per_device_graphs_with_work_around_the_collective(group: dist.LocalGroup) -> None:
    xs = [cg.zeros(4, "float32", device=d) for d in group.devices]
    for d in group.devices:
        d.synchronize()
    streams = [d.create_stream() for d in group.devices]
    sessions = [cg.capture(stream=s) for s in streams]
    graphs = [c.__enter__() for c in sessions]
    for x, s in zip(xs, streams):
        cg.ops.scale(2.0, x, out=x, stream=s)
    group.all_reduce(xs, streams=streams)
    for x, s in zip(xs, streams):
        cg.ops.scale(3.0, x, out=x, stream=s)
    for c in reversed(sessions):
        c.__exit__(None, None, None)
    for r, (x, s) in enumerate(zip(xs, streams)):
        x.set(np.full(4, 10.0**r, np.float32), stream=s)
    for g, s in zip(graphs, streams):
        g.replay(s)
    want = 3 * 2 * sum(10.0**r for r in range(len(group)))
    for x, s in zip(xs, streams):
        s.synchronize()
        np.testing.assert_array_equal(x.get(stream=s), np.full(4, want))


def test_a_graph_waits_on_whichever_of_its_collectives_can_finish(sim_group: dist.LocalGroup) -> None:
    d0, d1 = sim_group.devices
    xs = [cg.ones(4, "float32", device=d) for d in (d0, d1)]
    b, a = cg.zeros(4, "float32", device=d0), cg.full(4, 7.0, "float32", device=d1)
    for d in (d0, d1):
        d.synchronize()
    s0, s1 = d0.create_stream(), d1.create_stream()
    with cg.capture(stream=s0) as g:
        s1.wait(s0)
        sim_group[0].recv(b, 1, stream=s0)  # its send comes from outside the graph
        sim_group.all_reduce(xs, streams=[s0, s1])
        s0.wait(s1)
    sim_group[1].send(a, 0, stream=d1.create_stream())
    g.replay(s0)
    s0.synchronize()
    assert (b.get(stream=s0) == 7).all()
    assert (xs[0].get(stream=s0) == 2).all()


def test_ranks_meet_in_the_order_they_issue_not_the_order_streams_run(sim_group: dist.LocalGroup) -> None:
    devs = sim_group.devices
    for seed in range(8):
        devs[0].backend.reseed(seed)
        a = [cg.full(4, 1.0, "float32", device=d) for d in devs]
        b = [cg.full(4, 100.0, "float32", device=d) for d in devs]
        for d in devs:
            d.synchronize()
        first, second = [d.create_stream() for d in devs], [d.create_stream() for d in devs]
        sim_group.all_reduce(a, streams=first)
        sim_group.all_reduce(b, streams=second)
        for d in devs:
            d.synchronize()
        assert [a[0].get()[0], b[0].get()[0], a[1].get()[0], b[1].get()[0]] == [2, 200, 2, 200], seed


def test_group_calls_inside_a_capture_join_the_forked_streams_at_its_end(sim_group: dist.LocalGroup) -> None:
    d0, d1 = sim_group.devices
    xs = [cg.ones(4, "float32", device=d) for d in (d0, d1)]
    ys = [cg.ones(4, "float32", device=d) for d in (d0, d1)]
    for d in (d0, d1):
        d.synchronize()
    s0 = d0.create_stream()
    with cg.capture(stream=s0) as g, dist.group_calls():
        sim_group.all_reduce(xs, streams=[s0, None])
        sim_group.all_reduce(ys, streams=[s0, None])
    g.replay(d0.current_stream())
    assert (xs[1].get() == 2).all()
    assert (ys[1].get() == 2).all()


def test_many_eager_collectives_fill_the_queues_without_a_false_timeout(sim_group: dist.LocalGroup) -> None:
    from cudagraphs.backends.sim.streams import MAX_PENDING

    d0, d1 = sim_group.devices
    x0, x1 = cg.zeros(1, "float32", device=d0), cg.zeros(1, "float32", device=d1)
    for _ in range(MAX_PENDING + 10):  # rank 0's queue overflows before rank 1 has queued
        sim_group[0].all_reduce(x0)
    for _ in range(MAX_PENDING + 10):
        sim_group[1].all_reduce(x1)
    d0.synchronize()
    d1.synchronize()


def test_closing_keeps_the_communicator_for_its_graphs(sim_group: dist.LocalGroup) -> None:
    d0, d1 = sim_group.devices
    xs = [cg.ones(4, "float32", device=d) for d in (d0, d1)]
    for d in (d0, d1):
        d.synchronize()
    s0 = d0.create_stream()
    with cg.capture(stream=s0) as g:
        sim_group.all_reduce(xs, streams=[s0, None])
    sim_group.close()
    _recording.drain()
    g.replay(d0.current_stream())
    assert (xs[1].get() == 2).all()
    with pytest.raises(ValueError, match="closed"):
        sim_group.all_reduce(xs)


def test_tcp_store_is_pytorchs() -> None:
    pytest.importorskip("torch.distributed", reason="TCPStore needs PyTorch (the GPU machine has it)")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, world_size=1, is_master=True, timeout=1.0)
    from cudagraphs.distributed._store import exchange

    assert exchange(store, "k", b"\x00id\xff", "publish") == b"\x00id\xff"
    assert exchange(store, "k", None, "read") == b"\x00id\xff"
    with pytest.raises(cg.CollectiveTimeoutError):
        exchange(store, "never-set", None, "rank 1 waited for rank 0")
