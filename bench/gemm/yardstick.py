#!/usr/bin/env python3
"""cuBLAS / cuBLASLt yardstick for bench_gemm: the same V4-Flash prefill shapes through PyTorch on the GPU.

BF16: torch.mm(x [n, K], W [N, K].t()) in bf16 (cuBLAS), fp32 output when this PyTorch offers out_dtype.
FP8:  torch._scaled_mm(x [n, K], W [N, K].t()) in e4m3 (cuBLASLt) with DeepSeek's scaling — 1x128 activation
      blocks, 128x128 weight blocks — when this PyTorch and cuBLAS support it ("block"), and with one scale per
      tensor ("tensor": cuBLASLt's fastest FP8 path, no per-block promotion) for reference.
The inputs are already in the GEMM's format (bench_gemm's times include rounding fp32 activations).
Times: CUDA events around each call after warm-up, L2 flushed before each, mean of --iters.

    yardstick.py [--iters N] [--ours bench_gemm_output.txt]

With --ours, prints a markdown table of both and the ratios ours / yardstick, for the op (rounding the fp32
activations + GEMM) and for the GEMM alone on rounded activations (the like-for-like kernel comparison).
"""
import argparse
import re

import torch

SHAPES = [  # name, N, K, bf16 only
    ("wq_a", 1024, 4096, False),
    ("wq_b", 32768, 1024, False),
    ("wo_b", 4096, 8192, False),
    ("wkv", 512, 4096, False),
    ("shared_w1", 2048, 4096, False),
    ("shared_w2", 4096, 2048, False),
    ("lm_head", 129280, 4096, True),
]


def time_us(fn, iters, flush):
    for _ in range(2):
        fn()
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    total = 0.0
    for _ in range(iters):
        flush.zero_()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        total += start.elapsed_time(stop)
    return 1e3 * total / iters


def bf16_call(x, w):
    try:
        torch.mm(x, w.t(), out_dtype=torch.float32)
        return (lambda: torch.mm(x, w.t(), out_dtype=torch.float32)), "fp32 out"
    except (TypeError, RuntimeError):
        return (lambda: torch.mm(x, w.t())), "bf16 out"


def fp8_block_call(xq, wq, n, N, K):
    # cuBLASLt's DeepSeek recipe wants outer-dim-major scales: 1x128 as [n, K/128] with stride (1, n),
    # 128x128 as [K/128, N/128] with stride (1, K/128).
    sa = torch.rand(K // 128, n, device="cuda").t()
    sb = torch.rand(N // 128, K // 128, device="cuda").t()
    for out in (torch.float32, torch.bfloat16):
        try:
            torch._scaled_mm(xq, wq.t(), sa, sb, out_dtype=out)
            torch.cuda.synchronize()
            return (lambda: torch._scaled_mm(xq, wq.t(), sa, sb, out_dtype=out)), f"block, {str(out)[6:]} out"
        except (RuntimeError, NotImplementedError, ValueError) as e:
            error = str(e).splitlines()[0][:80]
    return None, f"block scaling unavailable: {error}"


def fp8_tensor_call(xq, wq):
    one = torch.ones((), device="cuda")
    for out in (torch.float32, torch.bfloat16):
        try:
            torch._scaled_mm(xq, wq.t(), one, one, out_dtype=out)
            torch.cuda.synchronize()
            return (lambda: torch._scaled_mm(xq, wq.t(), one, one, out_dtype=out)), f"tensor, {str(out)[6:]} out"
        except (RuntimeError, NotImplementedError, ValueError):
            continue
    return None, "tensor scaling unavailable"


def measure(iters):
    flush = torch.empty(4 * torch.cuda.get_device_properties(0).L2_cache_size, dtype=torch.int8, device="cuda")
    rows = []
    for fmt in ("bf16", "fp8"):
        for n in (512, 4096):
            for name, N, K, bf16_only in SHAPES:
                if fmt == "fp8" and bf16_only:
                    continue
                flops = 2.0 * n * N * K
                x = torch.rand(n, K, device="cuda") * 2 - 1
                w = torch.rand(N, K, device="cuda") * 2 - 1
                if fmt == "bf16":
                    xb, wb = x.to(torch.bfloat16), w.to(torch.bfloat16)
                    del x, w
                    fn, note = bf16_call(xb, wb)
                    us = time_us(fn, iters, flush)
                    rows.append((fmt, n, name, N, K, "cublas", us, flops / us / 1e6, note))
                    del xb, wb
                else:
                    xq, wq = x.to(torch.float8_e4m3fn), (w * 448).to(torch.float8_e4m3fn)
                    del x, w
                    for kind, (fn, note) in (("block", fp8_block_call(xq, wq, n, N, K)),
                                             ("tensor", fp8_tensor_call(xq, wq))):
                        us = time_us(fn, iters, flush) if fn else float("nan")
                        rows.append((fmt, n, name, N, K, f"cublaslt-{kind}", us, flops / us / 1e6, note))
                    del xq, wq
                torch.cuda.empty_cache()
    return rows


def read_ours(path):
    ours = {}
    pattern = (r"fmt=(\S+) n=(\d+) shape=(\S+) N=\d+ K=\d+ us=([\d.]+) tflops=([\d.]+) "
               r"gemm_us=([\d.]+) gemm_tflops=([\d.]+)")
    with open(path) as f:
        for line in f:
            m = re.match(pattern, line)
            if m:
                ours[(m[1], int(m[2]), m[3])] = tuple(float(v) for v in m.groups()[3:])
    return ours


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--ours", help="bench_gemm output to put side by side")
    args = parser.parse_args()
    print(f"# yardstick on {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    rows = measure(args.iters)
    for fmt, n, name, N, K, lib, us, tflops, note in rows:
        print(f"fmt={fmt} n={n} shape={name} N={N} K={K} lib={lib} us={us:.1f} tflops={tflops:.1f} ({note})")
    if not args.ours:
        return
    ours = read_ours(args.ours)
    print("\n| format | n | shape [N, K] | ours op µs | ours op TFLOP/s | ours GEMM µs | ours GEMM TFLOP/s "
          "| yardstick | TFLOP/s | op / yardstick | GEMM / yardstick |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for fmt, n, name, N, K, lib, us, tflops, note in rows:
        mine = ours.get((fmt, n, name))
        if mine is None:
            continue
        op_us, op_tflops, gemm_us, gemm_tflops = mine
        ok = tflops == tflops and tflops > 0
        op_ratio = op_tflops / tflops if ok else float("nan")
        gemm_ratio = gemm_tflops / tflops if ok else float("nan")
        print(f"| {fmt} | {n} | {name} [{N}, {K}] | {op_us:.1f} | {op_tflops:.1f} | {gemm_us:.1f} | {gemm_tflops:.1f} "
              f"| {lib} ({note}) | {tflops:.1f} | {op_ratio:.2f} | {gemm_ratio:.2f} |")


if __name__ == "__main__":
    main()
