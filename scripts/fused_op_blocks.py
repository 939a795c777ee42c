"""How fast PyTorch's fused CPU attention op runs on blocks of a given size, against a matmul.

    .venv/bin/python scripts/fused_op_blocks.py          # about a minute, one thread

N = 16384 queries cut into blocks of ``bs`` (blocks folded into the head dimension, as a
band of blocks is computed), B=1, H=8, D=64, float32: forward and backward of
``aten._scaled_dot_product_flash_attention_for_cpu`` with and without its causal mode, in
GFLOP/s of the work it is asked to do (causal mode: half the block). The last line is a
2048 x 2048 matmul's speed, the ceiling. Every figure is measured by this run.
"""

from __future__ import annotations

import time

import torch


def main() -> None:
    torch.set_num_threads(1)
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    bop = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    n, heads = 16384, 8
    for bs in (64, 128, 256, 512, 1024):
        nb = n // bs
        q, k, v, do = (torch.randn(1, heads * nb, bs, 64) for _ in range(4))  # (1, H*nb, bs, D)
        for causal in (False, True):
            op(q, k, v, 0.0, causal, scale=0.125)  # warm-up
            t0 = time.process_time()
            o, lse = op(q, k, v, 0.0, causal, scale=0.125)
            t1 = time.process_time()
            bop(do, q, k, v, o, lse, 0.0, causal, scale=0.125)
            t2 = time.process_time()
            flops = heads * n * bs * 4 * 64 * (0.5 if causal else 1.0)  # QK^T and PV over the block
            print(f"block {bs:>4}, causal={causal!s:<5}: fwd {flops / (t1 - t0) / 1e9:5.1f} GFLOP/s, "
                  f"bwd {2.5 * flops / (t2 - t1) / 1e9:5.1f} GFLOP/s")
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    t0 = time.process_time()
    a @ b
    print(f"matmul 2048 x 2048: {2 * 2048 ** 3 / (time.process_time() - t0) / 1e9:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
