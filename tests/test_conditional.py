"""Device-side control flow in captured graphs: while, if, if/else, switch."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import cudagraphs as cg


def countdown_graph(remaining: cg.DeviceArray, count: cg.DeviceArray) -> cg.Graph:
    minus, one = cg.full(1, -1, "int32"), cg.ones(1, "float32")
    with cg.capture() as g:
        cond = g.condition()
        cg.ops.set_condition(cond, remaining)
        with g.while_loop(cond):
            cg.ops.add(count, one, out=count)
            cg.ops.add(remaining, minus, out=remaining)
            cg.ops.set_condition(cond, remaining)
    return g


@pytest.mark.parametrize("n", [0, 1, 7, 1000])
def test_while_loop_runs_exactly_n_times(dev: cg.Device, n: int) -> None:
    remaining, count = cg.full(1, n, "int32"), cg.zeros(1, "float32")
    g = countdown_graph(remaining, count)
    assert [node.type for node in g.nodes].count("conditional") == 1
    assert count.get()[0] == 0  # capturing ran nothing
    g.replay()
    assert count.get()[0] == n
    assert remaining.get()[0] == 0
    remaining.set(np.array([n], np.int32))
    g.replay()
    assert count.get()[0] == 2 * n


def test_nested_if_inside_while(dev: cg.Device) -> None:
    remaining, count = cg.full(1, 7, "int32"), cg.zeros(1, "float32")
    toggle, hits = cg.zeros(1, "int32"), cg.zeros(1, "float32")
    minus, one_i, one = cg.full(1, -1, "int32"), cg.ones(1, "int32"), cg.ones(1, "float32")
    with cg.capture() as g:
        loop = g.condition()
        cg.ops.set_condition(loop, remaining)
        with g.while_loop(loop):
            cg.ops.scale(-1, toggle, out=toggle)
            cg.ops.add(toggle, one_i, out=toggle)  # toggle: 1, 0, 1, 0, ...
            odd = g.condition()
            cg.ops.set_condition(odd, toggle)
            with g.if_then(odd):
                cg.ops.add(hits, one, out=hits)
            cg.ops.add(count, one, out=count)
            cg.ops.add(remaining, minus, out=remaining)
            cg.ops.set_condition(loop, remaining)
    g.replay()
    assert count.get()[0] == 7
    assert hits.get()[0] == 4


def test_if_else_follows_a_device_scalar(dev: cg.Device) -> None:
    flag = cg.DeviceScalar(1, "int32")
    out = cg.zeros(1, "float32")
    with cg.capture() as g:
        cond = g.condition()
        cg.ops.set_condition(cond, flag)
        then, otherwise = g.if_else(cond)
        with then:
            cg.ops.fill(out, 10.0)
        with otherwise:
            cg.ops.fill(out, 20.0)
    for value, expected in ((1, 10.0), (0, 20.0), (5, 10.0), (-3, 10.0)):
        flag.set(value)
        g.replay()
        assert out.get()[0] == expected, value


def test_switch_runs_the_selected_branch_or_none(dev: cg.Device) -> None:
    index = cg.DeviceScalar(0, "int32")
    out = cg.zeros(1, "float32")
    with cg.capture() as g:
        cond = g.condition()
        cg.ops.set_condition(cond, index)
        for i, body in enumerate(g.switch(cond, 3)):
            with body:
                cg.ops.fill(out, float(i + 1))
    for value, expected in ((0, 1.0), (2, 3.0), (1, 2.0), (3, None), (-1, None), (1000, None)):
        cg.ops.fill(out, -7.0)
        index.set(value)
        g.replay()
        assert out.get()[0] == (-7.0 if expected is None else expected), value


@pytest.mark.parametrize("default", [0, 1])
def test_condition_default_applies_at_each_launch(dev: cg.Device, default: int) -> None:
    hits, one = cg.zeros(1, "float32"), cg.ones(1, "float32")
    with cg.capture() as g:
        cond = g.condition(default=default)
        with g.if_then(cond):
            cg.ops.add(hits, one, out=hits)
    g.replay()
    g.replay()
    assert hits.get()[0] == 2 * default


def test_bodies_on_an_explicit_stream(dev: cg.Device) -> None:
    s = dev.create_stream()
    out = cg.zeros(1, "float32")
    with cg.capture(stream=s) as g:
        cond = g.condition(default=1)
        with g.if_then(cond) as body:
            assert body.stream is not s
            assert dev.stream is not body.stream
            cg.ops.fill(out, 4.0, stream=body.stream)
    g.replay()
    s.synchronize()
    assert out.get(stream=s)[0] == 4.0
    s.close()


def test_misuse(dev: cg.Device) -> None:
    x = cg.ones(1, "float32")
    g0 = cg.capture(lambda: cg.ops.fill(x, 1.0))
    with pytest.raises(RuntimeError, match="added while capturing"):
        g0.condition()
    with cg.capture() as g:
        cond = g.condition()
        with pytest.raises(ValueError, match="default must be an int"):
            g.condition(default=-1)
        with pytest.raises(ValueError, match="switch needs n >= 1"):
            g.switch(cond, 0)
        with pytest.raises(TypeError, match="set_condition takes a Condition"):
            cg.ops.set_condition(3, x)
        with pytest.raises(TypeError, match="flag must be a non-empty device array"):
            cg.ops.set_condition(cond, np.ones(1))
        body = g.if_then(cond)
        with body:
            cg.ops.fill(x, 2.0)
        with pytest.raises(RuntimeError, match="already captured"), body:
            pass
    with cg.capture() as other:
        with pytest.raises(TypeError, match="made by this graph's condition"):
            other.while_loop(cond)
        cg.ops.fill(x, 3.0)


def test_exception_inside_a_body_undoes_everything(dev: cg.Device) -> None:
    gc.collect()
    before = dev.allocator.stats()
    stream = dev.stream
    x = cg.ones(8, "float32")
    with pytest.raises(ZeroDivisionError), cg.capture() as g:
        cond = g.condition(default=1)
        with g.while_loop(cond):
            t = cg.ops.scale(2.0, x)
            del t
            1 / 0  # noqa: B018 - the user's error inside a body
    assert dev.stream is stream  # the body's redirection is undone
    assert cg.capture_status() == "none"
    assert not dev.captures
    del x
    gc.collect()
    assert dev.allocator.stats().in_use == before.in_use
    assert cg.ops.scale(2.0, cg.ones(2, "float32")).get().tolist() == [2.0, 2.0]


def test_picture_shows_the_conditional_node(dev: cg.Device) -> None:
    out = cg.zeros(1, "float32")
    with cg.capture() as g:
        cond = g.condition(default=1)
        with g.if_then(cond):
            cg.ops.fill(out, 1.0)
    dot = g.to_dot()
    assert 'n0 [label="0: conditional"' in dot
    assert "subgraph cluster_n0_0_" in dot
    assert 'label="body 0 of node 0"' in dot
    assert 'n0_0_0 [label="0: kernel\\ncg_fill' in dot
    assert "n0 -> n0_0_0 [style=dashed" in dot


def test_an_updated_graph_resets_its_conditions_at_every_launch(dev: cg.Device) -> None:
    """The loop's condition starts from its default at each replay, after update() too."""
    count, minus, one = cg.zeros(1, "float32"), cg.full(1, -1, "int32"), cg.ones(1, "float32")
    start, remaining = cg.full(1, 3, "int32"), cg.zeros(1, "int32")

    def loop(counter: cg.DeviceArray) -> cg.Graph:
        with cg.capture(instantiate=counter is not count) as g:
            cg.ops.copy(remaining, start)
            cond = g.condition(default=1)
            with g.while_loop(cond):
                cg.ops.add(counter, one, out=counter)
                cg.ops.add(remaining, minus, out=remaining)
                cg.ops.set_condition(cond, remaining)
        return g

    other = cg.zeros(1, "float32")
    g = loop(other)
    g.update(loop(count))  # now counts into `count`, with the source's condition
    seen = []
    for _ in range(3):
        g.replay()
        seen.append(int(count.get()[0]))
    assert seen == [3, 6, 9]
    assert other.get()[0] == 0
    g.close()


def test_a_while_loop_with_no_work_in_its_body_is_refused(dev: cg.Device) -> None:
    """Issue 26 item 5: an empty while body (or one never captured) would spin forever: refused."""
    x = cg.zeros(4, "float32")
    gc.collect()
    before = dev.allocator.stats().in_use
    with pytest.raises(cg.CaptureError, match="the while body 0 recorded no work"), cg.capture() as g:
        cond = g.condition(default=1)
        with g.while_loop(cond):
            pass
    with (
        pytest.raises(
            cg.CaptureError, match=r"the while body 0 made at .*test_conditional.py:\d+: a while loop"
        ),
        cg.capture() as g,
    ):
        cond = g.condition(default=1)
        g.while_loop(cond, max_iterations=3)  # (its body never captured)
        cg.ops.fill(x, 1.0)
    assert cg.capture_status() == "none"
    assert not dev.captures
    gc.collect()
    assert dev.allocator.stats().in_use == before
    assert np.all(x.get() == 0)  # nothing ran
    # a loop whose body has work still captures and runs
    count, one = cg.zeros(1, "float32"), cg.ones(1, "float32")
    with cg.capture() as g:
        body = g.while_loop(g.condition(default=1), max_iterations=4)
        with body:
            cg.ops.add(count, one, out=count)
    g.replay()
    assert count.get()[0] == 4
