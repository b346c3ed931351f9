#!/usr/bin/env bash
# GPU check of branch rng2: PyTorch's random numbers in captures (shadow torch.cuda.CUDAGraph)
# together with PyTorch's allocator routing, which aborted processes on torch 2.11 with c10's
# "captures_underway.empty() INTERNAL ASSERT FAILED at CUDACachingAllocator.cpp:3662".
#
# Run from the repository root on a GPU machine (torch 2.11, cupy 14):
#     OUT=/some/dir bash gpu_rng_check.sh
# It builds the compiled modules, then runs each test file in its own pytest process (an abort
# in one hides nothing of the others) and a step-by-step repro, all under `timeout`, in about
# five minutes. Everything goes to $OUT: summary.txt first (rc 134 = SIGABRT, 124 = timeout),
# one log per test file, repro_all.log (all steps in one process: the last "STEP" line before an
# abort names the step) and repro_<step>.log (each step alone).
set -u
OUT=${OUT:-$PWD/gpu_rng_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH=src CUDAGRAPHS_TEST_BACKENDS=cuda,sim PYTHONFAULTHANDLER=1 TORCH_SHOW_CPP_STACKTRACES=1
BUDGET=${BUDGET:-340}  # seconds for the whole script (the repro and tests are cut to what is left)
T0=$(date +%s)
left() { local l=$((BUDGET - ($(date +%s) - T0))); echo $((l < 30 ? 30 : l)); }
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    $PY -c "import torch, cupy; print('torch', torch.__version__, torch.version.git_version, 'cuda', torch.version.cuda); print('cupy', cupy.__version__)"
    git log --oneline -4
} >"$OUT/env.txt" 2>&1

timeout -k 5 180 $PY setup.py -q build_ext --inplace >"$OUT/build.log" 2>&1
echo "build rc=$? $(($(date +%s) - T0))s" >>"$SUMMARY"

# the repro: each step, then a probe that aborts the process if PyTorch's allocator still counts
# a capture underway (a MemPool made and dropped: ~MemPool empties its cache, which asserts none
# is) and fails if a generator was left in capture mode (an eager draw)
cat >"$OUT/repro.py" <<'EOF'
import faulthandler
import sys
import traceback

faulthandler.enable()
import torch

import cudagraphs as cg
from cudagraphs.interop import _torch_rng

N = 1 << 12


def say(*a):
    print(*a, flush=True)


def probe(tag):
    p = torch.cuda.MemPool()
    del p
    torch.rand(4, device="cuda")
    torch.cuda.synchronize()
    say(f"  probe after {tag}: ok (no capture left underway, eager draws work)")


def rand():
    out = torch.empty(N, device="cuda")
    g = cg.capture(lambda: out.copy_(torch.rand(N, device="cuda") * 2))
    torch.manual_seed(5)
    g.replay()
    g.stream.synchronize()
    a = out.clone()
    g.replay()
    g.stream.synchronize()
    b = out.clone()
    torch.manual_seed(5)
    want = torch.rand(N, device="cuda") * 2
    say(f"  shadow kept: {g._rng is not None}; self-test: {_torch_rng._verdict}")
    assert not torch.equal(a, b), "two replays drew the same numbers"
    assert torch.equal(a, want), "not eager's numbers after the same seed"
    g.close()


def loop():  # test_interop_gpu's LOOP with a draw: the previous g, its pool, its MemPool die in a capture
    x = torch.ones(64, device="cuda")
    for _ in range(4):
        with cg.capture() as g:
            y = x * 2 + torch.rand(64, device="cuda") * 0
            x.copy_(y)
            del y
        g.replay()
        g.close()
    torch.cuda.synchronize()
    assert torch.all(x == 16), x


def dropped_in_capture():  # a graph (its pool and MemPool) dropped inside another capture
    x = torch.ones(64, device="cuda")
    with cg.capture() as g1:
        x.mul_(2)
    with cg.capture() as g2:
        x.add_(torch.rand(64, device="cuda") * 0)
        g1.close()
        del g1
    g2.replay()
    torch.cuda.synchronize()
    g2.close()


def _refused(body):
    out = torch.empty(N, device="cuda")
    try:
        with cg.capture():
            out.copy_(torch.rand(N, device="cuda"))
            body(out)
    except cg.CaptureError as e:
        say("  refused:", str(e).splitlines()[0][:200])
    else:
        raise AssertionError("no refusal")


def item_refusal():
    _refused(lambda out: out.sum().item())


def sync_refusal():  # a device-wide synchronize: it may invalidate the shadow's capture too
    _refused(lambda out: torch.cuda.synchronize())


def _model():
    torch.manual_seed(0)
    nn = torch.nn
    return nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.2), nn.Tanh(), nn.Linear(32, 8)).cuda().train()


def training():  # graphed(grad=True): forward and backward captures, the backward's autograd routed
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    step = cg.graphed(model, grad=True)
    gen = torch.Generator(device="cuda").manual_seed(1)
    for _ in range(4):
        x = torch.randn(8, 16, device="cuda", generator=gen)
        y = torch.randn(8, 8, device="cuda", generator=gen)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(step(x), y)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    say(f"  last loss {float(loss):.5f}")
    assert all(torch.isfinite(p).all() for p in model.parameters())
    step.close()


def training_refusal():
    model = _model()

    def fn(x):
        y = model(x)
        y.sum().item()
        return y

    step = cg.graphed(fn, grad=True, params=list(model.parameters()))
    try:
        step(torch.randn(8, 16, device="cuda"))
    except cg.CaptureError as e:
        say("  refused:", str(e).splitlines()[0][:200])
    else:
        raise AssertionError("no refusal")


def torch_graph():  # PyTorch's own graph with a draw, after ours
    out = torch.empty(N, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.rand(N, device="cuda")
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out.copy_(torch.rand(N, device="cuda"))
    g.replay()
    a = out.clone()
    g.replay()
    torch.cuda.synchronize()
    assert not torch.equal(a, out)


STEPS = [rand, loop, dropped_in_capture, item_refusal, sync_refusal, training, training_refusal, torch_graph]

if __name__ == "__main__":
    say(f"torch {torch.__version__}; _cuda_endAllocateCurrentStreamToPool: "
        f"{hasattr(torch._C, '_cuda_endAllocateCurrentStreamToPool')}")
    chosen = [s for s in STEPS if s.__name__ in sys.argv[1:]] or STEPS
    failed = []
    for step in chosen:
        say(f"STEP {step.__name__}")
        try:
            step()
            probe(step.__name__)
            say(f"STEP {step.__name__}: ok")
        except Exception:
            failed.append(step.__name__)
            say(f"STEP {step.__name__}: FAILED")
            traceback.print_exc()
            sys.stdout.flush()
    say(f"DONE failed={failed}")
    sys.exit(1 if failed else 0)
EOF

verdict() {  # rc -> words
    case $1 in 0) echo ok ;; 134) echo "ABORTED (SIGABRT)" ;; 124 | 137) echo "TIMED OUT" ;; *) echo "rc=$1" ;; esac
}

# the test files, each in its own process, side by side
for f in test_torch_random_gpu test_refusal_gpu test_interop_gpu test_training_gpu test_keepalive test_graphed test_torch_random; do
    (
        t=$(date +%s)
        timeout -k 10 $(($(left) - 15)) $PY -X faulthandler -m pytest -v -rfE --tb=short -p no:cacheprovider \
            -o faulthandler_timeout=150 "tests/$f.py" >"$OUT/$f.log" 2>&1
        rc=$?
        last=""
        [ $rc -eq 0 ] || [ $rc -eq 1 ] || last="; last test: $(grep -o 'tests/[^ ]*::[^ ]*' "$OUT/$f.log" | tail -1)"
        echo "$f: $(verdict $rc) $(($(date +%s) - t))s; $(tail -1 "$OUT/$f.log")$last" >>"$SUMMARY"
    ) &
done

# the repro: all steps in one process, then each alone (after the first, in turn)
(
    t=$(date +%s)
    CUDAGRAPHS_BACKEND=cuda timeout -k 5 150 $PY "$OUT/repro.py" >"$OUT/repro_all.log" 2>&1
    rc=$?
    echo "repro (all steps): $(verdict $rc) $(($(date +%s) - t))s; last: $(grep '^STEP\|^DONE' "$OUT/repro_all.log" | tail -1)" >>"$SUMMARY"
    for s in rand loop dropped_in_capture item_refusal sync_refusal training training_refusal torch_graph; do
        [ "$(left)" -gt 40 ] || { echo "repro $s: not run (time)" >>"$SUMMARY"; continue; }
        lim=$(($(left) - 10))
        CUDAGRAPHS_BACKEND=cuda timeout -k 5 $((lim < 60 ? lim : 60)) $PY "$OUT/repro.py" "$s" >"$OUT/repro_$s.log" 2>&1
        rc=$?
        echo "repro $s alone: $(verdict $rc)" >>"$SUMMARY"
    done
) &
wait

grep -l "INTERNAL ASSERT" "$OUT"/*.log >"$OUT/asserts.txt" 2>/dev/null
{
    echo "logs with an INTERNAL ASSERT: $(tr '\n' ' ' <"$OUT/asserts.txt")"
    echo "total $(($(date +%s) - T0))s"
} >>"$SUMMARY"
cat "$SUMMARY"
