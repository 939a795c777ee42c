"""The ``flex`` backend: ``torch.nn.attention.flex_attention`` (FlexAttention).

The mask becomes FlexAttention's ``mask_mod`` and ``BlockMask`` (the mask's own
``allows``), a bias tensor or function its ``score_mod``. The kernel is compiled with
``torch.compile`` on first use for each shape (seconds to tens of seconds on a CPU).
Where it runs: CUDA (forward and backward) and, on PyTorch builds that support it,
CPU forward only (its backward is not implemented there). No dropout, no weights.
Computes the function of the ``math`` backend; fully masked rows give zeros.
"""

from __future__ import annotations

import functools

import torch

from .call import AttentionCall
from .registry import Backend, register


@functools.lru_cache(maxsize=1)
def _flex_api():
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as e:  # pragma: no cover - depends on the torch build
        return None, f"this torch ({torch.__version__}) has no FlexAttention: {e}"
    return (flex_attention, create_block_mask), None


@functools.lru_cache(maxsize=1)
def _compiled():
    api, _ = _flex_api()
    return torch.compile(api[0], dynamic=False)


class FlexBackend(Backend):
    name = "flex"
    summary = "torch FlexAttention, compiled (CUDA; CPU forward only)"

    def available(self) -> str | None:
        return _flex_api()[1]

    def supports(self, call: AttentionCall) -> str | None:
        if call.return_weights:
            return "does not return the weights (return_weights=True needs 'math')"
        if call.dropout_p > 0:
            return "FlexAttention has no dropout"
        if call.device.type == "cpu" and call.needs_grad:
            return "FlexAttention on cpu runs forward only (its backward is not implemented on cpu)"
        if call.device.type not in ("cpu", "cuda"):
            return f"FlexAttention does not run on {call.device.type}"
        if call.dtype == torch.float64:
            return "FlexAttention's compiled kernels do not take float64"
        if call.N < 16 or call.M < 16:
            return f"FlexAttention's compiled kernels need at least 16 queries and keys (N={call.N}, M={call.M})"
        return None

    def estimate(self, call: AttentionCall) -> float:
        if call.device.type == "cpu":
            return float("inf")  # compile time dominates on CPU; never chosen by auto there
        frac = 1.0
        if call.mask is not None:
            from .chunked import plan_tiles

            frac = max(plan_tiles(call, 128, 128).computed_fraction, 1e-3)
        return call.flops() * frac / 1.5

    def forward(self, call: AttentionCall):
        (flex_attention, create_block_mask), _ = _flex_api()
        n_q, n_k = call.N, call.M
        block_mask = None
        if call.mask is not None:
            m = call.mask

            def mask_mod(b, h, q_idx, kv_idx):
                return m.allows(b, h, q_idx, kv_idx, n_q, n_k)

            bm_b = call.B if "b" in m.depends else None
            bm_h = call.H if "h" in m.depends else None
            block_mask = create_block_mask(mask_mod, bm_b, bm_h, n_q, n_k, device=call.device)
        score_mod = None
        if call.has_bias():
            bias_t, bias_fn = call.bias, call.bias_fn

            def score_mod(score, b, h, q_idx, kv_idx):
                if bias_t is not None:
                    bb = bias_t[
                        b if bias_t.shape[0] != 1 else 0,
                        h if bias_t.shape[1] != 1 else 0,
                        q_idx if bias_t.shape[2] != 1 else 0,
                        kv_idx if bias_t.shape[3] != 1 else 0,
                    ]
                    score = score + bb
                if bias_fn is not None:
                    score = score + bias_fn(b, h, q_idx, kv_idx)
                return score

        out = _compiled()(
            call.q, call.k, call.v, score_mod=score_mod, block_mask=block_mask, scale=call.scale,
            enable_gqa=call.G > 1,
        )  # (B, H, N, Dv)
        return out, None


register(FlexBackend())
