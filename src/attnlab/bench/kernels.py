"""The ``kernels`` suite: every exact backend x mask kind x sequence length.

For each case it measures the forward (under ``no_grad``) and forward+backward time
and peak memory, the useful FLOPs (only allowed score elements count:
``4 D * pairs * B * H`` forward, 2.5 times that forward+backward), GFLOP/s and their
fraction of this machine's matmul ceiling, and the maximum relative error of the
output against a float64 oracle (the NumPy ``reference`` backend on every row for
N <= 1024, float64 torch on 128 spread-out rows above). ``auto`` is measured like a
backend, with the backend it chose. The ``reference`` backend itself is not timed.

The suite also compares :class:`attnlab.layers.MultiHeadAttention` with
``torch.nn.MultiheadAttention`` (embed 512, 8 heads): ours is built from theirs with
:meth:`~attnlab.layers.MultiHeadAttention.from_torch`, so both hold the same weights.

Shape legend: ``B`` batch, ``H`` heads, ``N`` queries = keys, ``D`` head dim, ``E`` embed dim.
"""

from __future__ import annotations

import torch

from ..exact import attention, backends, choose_backend, make_call
from ..layers import MultiHeadAttention
from .common import (
    MASK_KINDS,
    MODES,
    REFERENCE_MAX_N,
    allowed_pairs,
    check_rows,
    make_inputs,
    make_mask,
    max_rel_error,
    measure_mode,
    mode_op,
    oracle_rows,
)
from .measure import Unsupported, torch_dtype
from .report import kernel_rows, line_plot, text_table
from .suite import RunOptions, Suite, register_suite
from .verdict import MODE_WORDS, auto_vs_sdpa, kernel_decision_rows, kernel_verdicts

SUITE = "kernels"
#: sequence lengths per profile (``--lengths`` replaces them)
LENGTHS = {"quick": [512, 1024, 2048, 4096], "standard": [512, 1024, 2048, 4096],
           "full": [512, 1024, 2048, 4096, 8192, 16384]}
#: embed dim and heads of the layer comparison
LAYER_E, LAYER_H = 512, 8


def timed_backends() -> list[str]:
    """Registered backends that are timed (all but the NumPy oracle), then ``auto``."""
    return [n for n in backends() if n != "reference"] + ["auto"]


def cases(lengths: list[int], device: str, dtype: str, profile: str, mask_kinds=MASK_KINDS,
          B: int = 1, H: int = 8, D: int = 64, layer_n: int | None = 4096,  # noqa: N803
          names: list[str] | None = None) -> list[dict]:
    """The case specs of this suite (one per backend x mask x N x mode, then the layers).

    ``names`` keeps only these backends (``auto`` included); the layer comparison runs
    when ``layer_n`` is set.

    A backend unavailable in this environment (``available()`` says why) is recorded
    as unsupported without starting a process. On CPU the quick profile skips
    ``flex``, which compiles for every shape (about half a minute each).
    """
    specs = []
    for name in timed_backends():
        if names is not None and name not in names:
            continue
        skip = None
        if name != "auto":
            why = backends()[name].available()
            if why is not None:
                skip = {"status": "unsupported", "reason": why}
        if skip is None and name == "flex" and profile == "quick" and not device.startswith("cuda"):
            skip = {"status": "skipped", "reason": "flex compiles for every shape on cpu (~30 s each); "
                                                   "measured by --profile full"}
        for mask in mask_kinds:
            for n in lengths:
                for mode in MODES:
                    specs.append({"suite": SUITE, "kind": "backend", "name": name, "mask": mask, "N": n,
                                  "B": B, "H": H, "D": D, "dtype": dtype, "device": device, "mode": mode,
                                  "settings": {}, "skip": skip})
    if layer_n:
        for name in ("attnlab.MultiHeadAttention", "torch.nn.MultiheadAttention"):
            for mode in MODES:
                specs.append({"suite": SUITE, "kind": "layer", "name": name, "mask": "none", "N": layer_n,
                              "B": 1, "H": LAYER_H, "D": LAYER_E // LAYER_H, "dtype": dtype, "device": device,
                              "mode": mode, "settings": {"embed_dim": LAYER_E}, "skip": None})
    return specs


def _flops(pairs: int, spec: dict) -> float:
    f = 4.0 * spec["D"] * pairs * spec["H"]
    return f if spec["mode"] == "fwd" else 2.5 * f


def run_case(spec: dict) -> dict:
    """Measure one case in this process (see the module docstring)."""
    if spec["kind"] == "layer":
        return _run_layer(spec)
    name, mode = spec["name"], spec["mode"]
    q, k, v = make_inputs(spec)
    mask = make_mask(spec["mask"], spec["N"], spec["B"])
    if mode == "fwd_bwd":
        for t in (q, k, v):
            t.requires_grad_(True)
    res: dict = {}
    with torch.set_grad_enabled(mode == "fwd_bwd"):
        if name == "auto":
            res["chosen"] = choose_backend(q, k, v, mask=mask)
        else:
            why = backends()[name].verdict(make_call(q, k, v, mask=mask))
            if why is not None:
                raise Unsupported(why)

    def fn(q, k, v):
        return attention(q, k, v, mask=mask, backend=name)

    res.update(measure_mode(mode_op(fn, q, k, v, mode), spec))
    res["flops"] = _flops(allowed_pairs(mask, spec["B"], spec["N"], spec["N"]), spec)
    if mode == "fwd":
        with torch.no_grad():
            out = fn(q, k, v)  # (B, H, N, D)
        if spec["N"] <= REFERENCE_MAX_N:
            ref = attention(q.detach(), k.detach(), v.detach(), mask=mask, backend="reference").double()
            res["error"], res["error_oracle"] = max_rel_error(out, ref), "reference (all rows)"
        else:
            rows = check_rows(spec["N"])
            ref = oracle_rows(q, k, v, mask, rows)  # (B, H, R, D)
            res["error"] = max_rel_error(out[:, :, rows.to(out.device)], ref)
            res["error_oracle"] = f"float64 torch ({len(rows)} rows)"
    return res


# -- the layer comparison ----------------------------------------------------------------------


def _call_layer(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Self-attention output ``(B, N, E)`` of either layer (torch's returns ``(out, None)``)."""
    if isinstance(layer, torch.nn.MultiheadAttention):
        return layer(x, x, x, need_weights=False)[0]
    return layer(x)


def _run_layer(spec: dict) -> dict:
    e, h, n, B = spec["settings"]["embed_dim"], spec["H"], spec["N"], spec["B"]  # noqa: N806
    dt = torch_dtype(spec["dtype"])
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(e, h, batch_first=True)
    ours = MultiHeadAttention.from_torch(theirs)  # the same weights
    theirs, ours = theirs.to(spec["device"], dt).eval(), ours.to(spec["device"], dt).eval()
    x = torch.randn(B, n, e, generator=torch.Generator().manual_seed(1)).to(spec["device"], dt)  # (B, N, E)
    layer = ours if spec["name"].startswith("attnlab") else theirs

    def fn(x, _k, _v):
        return _call_layer(layer, x)

    params = list(layer.parameters())
    res = measure_mode(mode_op(fn, x, x, x, spec["mode"], params), spec)
    flops = B * (8.0 * n * e * e + 4.0 * n * n * e)  # projections + the two attention products
    res["flops"] = flops if spec["mode"] == "fwd" else 3.0 * flops
    res["weights_copied"] = True
    if spec["mode"] == "fwd" and layer is ours:
        with torch.no_grad():
            res["error"] = max_rel_error(_call_layer(ours, x), _call_layer(theirs, x))
            res["error_oracle"] = "torch.nn.MultiheadAttention with the same weights"
    return res


# -- the suite object ----------------------------------------------------------------------------

_NUM = {"type": "number"}


class KernelsSuite(Suite):
    """Every exact backend (and ``auto``) x mask kind x N x mode, plus the layer comparison."""

    name = SUITE
    summary = "exact attention backends x masks x N (time, memory, GFLOP/s, error), and the layer comparison"
    order = 10
    kinds = ("backend", "layer")
    modes = MODES
    result_keys = ("chosen", "weights_copied")
    case_properties = {
        "chosen": {"type": ["string", "null"], "description": "the backend auto chose"},
        "weights_copied": {"type": "boolean"},
    }
    results_properties = {
        "auto_vs_sdpa": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["mask", "N", "mode", "auto_s", "sdpa_s", "ratio"],
                "properties": {"mask": {"type": "string"}, "N": {"type": "integer"}, "mode": {"type": "string"},
                               "auto_s": _NUM, "sdpa_s": _NUM, "ratio": _NUM, "chosen": {"type": ["string", "null"]}},
            },
        },
    }
    results_required = ("auto_vs_sdpa",)

    def _lengths(self, opts: RunOptions) -> list[int]:
        return list(opts.lengths or LENGTHS.get(opts.profile, LENGTHS["quick"]))

    def cases(self, opts: RunOptions) -> list[dict]:
        return cases(self._lengths(opts), opts.device, opts.dtype, opts.profile, opts.mask_kinds or MASK_KINDS,
                     layer_n=opts.layer_n, names=opts.names)

    def run_case(self, spec: dict) -> dict:
        return run_case(spec)

    def known_names(self) -> set[str]:
        return set(timed_backends())

    def lengths(self, opts: RunOptions, specs: list[dict]) -> list[int]:
        return self._lengths(opts)

    def verdicts(self, records: list[dict], settings: dict) -> list[dict]:
        return kernel_verdicts(records)

    def extra_results(self, records: list[dict]) -> dict:
        return {"auto_vs_sdpa": auto_vs_sdpa(records)}

    def decision_rows(self, records: list[dict]) -> list[list[str]]:
        return kernel_decision_rows(records)

    def summary_lines(self, results: dict) -> list[str]:
        out: list[str] = []
        cs = self.own(results["cases"])
        if any(c["kind"] == "backend" for c in cs):
            out += ["", "kernels (time ms, peak MB beyond inputs):", text_table(*kernel_rows(results, width=60))]
        if any(c["kind"] == "layer" for c in cs):
            out += ["", "layers:", text_table(*kernel_rows(results, "layer", width=60))]
        if results.get("auto_vs_sdpa"):
            out += ["", "auto / sdpa time: " + ", ".join(
                f"{r['mask']} N={r['N']} {r['mode']}: {r['ratio']:.2f}" for r in results["auto_vs_sdpa"])]
        return out

    def report_blocks(self, results: dict) -> list[tuple]:
        b: list[tuple] = []
        cs = self.own(results["cases"])
        if any(c["kind"] == "backend" for c in cs):
            b.append(("h2", "Kernels"))
            b.append(("p", "Time is the median per call; memory is the peak allocated beyond the inputs; FLOPs count "
                           "only allowed score elements; error is max|out−ref| / max|ref| against a float64 oracle."))
            b.append(("table", *kernel_rows(results)))
        if results.get("auto_vs_sdpa"):
            b.append(("h2", "auto vs sdpa"))
            b.append(("table", ["mask", "N", "mode", "auto ms", "sdpa ms", "auto/sdpa", "auto chose"],
                      [[r["mask"], str(r["N"]), r["mode"], f"{r['auto_s'] * 1e3:,.2f}", f"{r['sdpa_s'] * 1e3:,.2f}",
                        f"{r['ratio']:.2f}", r.get("chosen") or ""] for r in results["auto_vs_sdpa"]]))
        if any(c["kind"] == "layer" for c in cs):
            b.append(("h2", "Layers"))
            b.append(("p", "attnlab MultiHeadAttention vs torch.nn.MultiheadAttention, same weights; error of "
                           "attnlab's output against torch's."))
            b.append(("table", *kernel_rows(results, "layer")))
        return b

    def plots(self, results: dict, cases: list[dict], out_dir: str, plt) -> list[str]:
        files = []
        kern = [c for c in self.own(cases) if c["kind"] == "backend"]
        for mask in dict.fromkeys(c["mask"] for c in kern):
            groups = {MODE_WORDS[m]: [c for c in kern if c["mask"] == mask and c["mode"] == m] for m in MODE_WORDS}
            files += line_plot(plt, out_dir, f"kernels_time_{mask}.png", f"kernels, mask {mask}: time", "time_s",
                               "ms per call", groups, 1e3)
            files += line_plot(plt, out_dir, f"kernels_memory_{mask}.png", f"kernels, mask {mask}: peak memory",
                               "peak_bytes", "MB beyond inputs", groups, 1 / 2**20)
        return files

    def tiny_options(self) -> dict | None:
        return {"lengths": [64], "mask_kinds": ["causal"], "names": ["math", "sdpa"], "layer_n": None}


register_suite(KernelsSuite())

__all__ = ["LENGTHS", "SUITE", "KernelsSuite", "cases", "run_case", "timed_backends"]
