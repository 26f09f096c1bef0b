#!/usr/bin/env python3
"""PyTorch's CPU kernel for the same two sums, timed like benches/cpu_reduce.rs.

PyTorch has no CPU kernel for `batch_norm_backward_reduce` (CUDA only), so the peer is
`torch.ops.aten.native_batch_norm_backward(dy, x, weight, None, None, mean, invstd, True, eps,
[False, True, True])` on CPU: with grad_input masked off it computes exactly
grad_weight = sum(dy * (x - mean)) * invstd and grad_bias = sum(dy) per channel, plus C multiplies
and two [C] allocations. Its NCHW kernel (aten/src/ATen/native/cpu/batch_norm_kernel.cpp) is
parallel over channels; for f32 it reads each dy plane twice (reduce_all for sum(dy), then
map2_reduce_all with x), for f16/bf16 once (one fused loop); its channels-last kernel walks rows
of C into per-thread [C] buffers. f16/bf16 inputs take f32 mean/invstd/weight (torch's mixed-type
path, f32 outputs), like our f32 outputs.

Usage: torch_peer.py THREADS CASE...   where CASE = dtype:layout:d0,d1,...  (layout nchw|cl)
Prints a header line starting with '#', then one line per case: CASE seconds_per_call.
`torch_peer.py --serve THREADS CASE [FILE X_OFFSET]` makes the case's tensors once (views of a
shared mapping of FILE when given, see `tensors`), prints '# ready', then answers
each line read from stdin with one timing (seconds per call, best of its rounds) until stdin
closes: the Rust bench alternates its own timing with the peer's several times per case, so a
drift of the machine's memory bandwidth between the two (it moves by half on this shared VM)
cannot favour either.
`torch_peer.py --serve-step THREADS CASE FILE X_OFFSET` serves timings of one BatchNorm training
step the same way (benches/cpu_step.rs): `y = bn(x); y.backward(dy)` with `bn =
torch.nn.BatchNorm{1,2,3}d(C)` in training mode (f32 parameters, as torch makes them), on copies
of the file's dy and x in the case's memory format (see `step`).
Exits with status 3 when torch cannot be imported (the Rust bench then shows no peer column).
"""

import math
import sys
import time

try:
    import torch
except Exception as e:  # noqa: BLE001 - any import failure means "no peer"
    print(f"# torch not importable: {e}")
    sys.exit(3)


def best_time(f, cached):
    f()
    t = time.perf_counter()
    f()
    once = max(time.perf_counter() - t, 1e-7)
    batch = max(1, min(100000, int((0.01 if cached else 0.0) / once)))
    # At least 15 (cached) or 8 rounds, and on for up to 1 s: on a shared 2-core machine an
    # OpenMP barrier whose other thread is descheduled costs milliseconds, so quiet rounds count.
    rounds, budget = (15, 1.0) if cached else (8, 0.0)
    best = float("inf")
    start = time.perf_counter()
    k = 0
    while k < rounds or (time.perf_counter() - start < budget and k < 200):
        t = time.perf_counter()
        for _ in range(batch):
            f()
        best = min(best, (time.perf_counter() - t) / batch)
        k += 1
    return best


def strides(shape, channels_last):
    """Row-major strides of `shape`, or channels-last ones (dim 1 innermost), as the Rust bench's."""
    order = list(range(len(shape)))
    if channels_last:
        order.remove(1)
        order.append(1)
    st = [0] * len(shape)
    step = 1
    for d in reversed(order):
        st[d] = step
        step *= shape[d]
    return st


def tensors(case, inputs=None):
    """The case's inputs and the call that times PyTorch's kernel on them, and its bytes.

    With `inputs` = (file, x's byte offset) (the file holds dy's elements at 0 and x's at that
    offset, in the case's layout), dy and x are views of a shared mapping of it: the Rust bench
    maps the same file, so both kernels read the same pages. Without it, random tensors of this
    process's own."""
    dtypes = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
    name, layout, dims = case.split(":")
    shape = [int(d) for d in dims.split(",")]
    dt = dtypes[name]
    if inputs is not None:
        n = math.prod(shape)
        path, x_offset = inputs
        size = dt.itemsize
        flat = torch.from_file(path, shared=True, size=x_offset // size + n, dtype=dt)
        st = strides(shape, layout == "cl")
        dy = torch.as_strided(flat, shape, st, 0)
        x = torch.as_strided(flat, shape, st, x_offset // size)
    else:
        g = torch.Generator().manual_seed(11)
        dy = (torch.rand(shape, generator=g) * 4 - 2).to(dt)
        x = (torch.rand(shape, generator=g) * 6 - 3).to(dt)
        if layout == "cl":
            fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(len(shape))
            if fmt is not None:
                dy = dy.contiguous(memory_format=fmt)
                x = x.contiguous(memory_format=fmt)
    c = shape[1]
    mean = torch.arange(c, dtype=torch.float32) * 0.1
    invstd = torch.ones(c, dtype=torch.float32)
    w = torch.ones(c, dtype=torch.float32)
    op = torch.ops.aten.native_batch_norm_backward

    def call():
        op(dy, x, w, None, None, mean, invstd, True, 1e-5, [False, True, True])

    return call, 2 * dy.numel() * dy.element_size()


def step(case, inputs):
    """One training step of torch.nn.BatchNorm on copies (this process's own memory, in the
    case's memory format) of the dy and x the file holds, and the bytes of one input."""
    dtypes = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
    name, layout, dims = case.split(":")
    shape = [int(d) for d in dims.split(",")]
    dt = dtypes[name]
    n = math.prod(shape)
    path, x_offset = inputs
    flat = torch.from_file(path, shared=False, size=x_offset // dt.itemsize + n, dtype=dt)
    st = strides(shape, layout == "cl")
    dy = torch.as_strided(flat, shape, st, 0).clone()
    x = torch.as_strided(flat, shape, st, x_offset // dt.itemsize).clone().requires_grad_()
    layer = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d, 5: torch.nn.BatchNorm3d}
    bn = layer[len(shape)](shape[1])
    with torch.no_grad():
        bn.weight.copy_(1.0 + 0.01 * torch.arange(shape[1], dtype=torch.float32))
        bn.bias.copy_(0.1 * torch.arange(shape[1], dtype=torch.float32))
    bn.train()

    def call():
        x.grad = None
        bn.weight.grad = None
        bn.bias.grad = None
        y = bn(x)
        y.backward(dy)

    return call, n * dt.itemsize


def header(threads):
    torch.set_num_threads(threads)
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"capability {torch.backends.cpu.get_cpu_capability()}", flush=True)


def serve(threads, case, inputs=None, make=None):
    header(threads)
    call, nbytes = (make or tensors)(case, inputs)
    print("# ready", flush=True)
    for _ in sys.stdin:
        print(f"{best_time(call, nbytes < (64 << 20)):.9g}", flush=True)


def main():
    if sys.argv[1] == "--serve-step":
        serve(int(sys.argv[2]), sys.argv[3], (sys.argv[4], int(sys.argv[5])), step)
        return
    if sys.argv[1] == "--serve":
        inputs = (sys.argv[4], int(sys.argv[5])) if len(sys.argv) > 5 else None
        serve(int(sys.argv[2]), sys.argv[3], inputs)
        return
    threads = int(sys.argv[1])
    header(threads)
    for case in sys.argv[2:]:
        call, nbytes = tensors(case)
        t = best_time(call, nbytes < (64 << 20))
        print(f"{case} {t:.9g}", flush=True)
        del call


if __name__ == "__main__":
    main()
