"""The ``mechanisms`` suite: every registered mechanism x sequence length.

Each mechanism in :func:`attnlab.mechanisms.mechanisms` is built with settings suited
to N from :data:`SETTINGS` (names are matched to the constructor's own parameter
names through :data:`ALIASES`; sizes such as ``head_dim`` or ``max_len`` are filled
in when the constructor asks for them). It measures forward and forward+backward time
and peak memory, records ``mech.cost(...)`` beside the measurement, and the relative
error ``||out - exact||_F / ||exact||_F`` of the output against exact attention in
float64 on the same random inputs (on 128 spread-out rows at large N). A mechanism
that cannot be built or cannot serve the call is recorded with the reason.

Shape legend: ``B`` batch, ``H`` heads, ``N`` queries = keys, ``D`` head dim.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

from ..mechanisms import mechanisms
from .common import MODES, check_rows, fro_rel_error, make_inputs, measure_mode, mode_op, oracle_rows
from .measure import Unsupported, torch_dtype

SUITE = "mechanisms"

#: settings per mechanism as a function of (N, D, H); unknown mechanisms get defaults
SETTINGS: dict[str, Callable[[int, int, int], dict]] = {
    "linformer": lambda n, d, h: {"k": 256, "max_len": n},
    "performer": lambda n, d, h: {"features": 256},
    "nystrom": lambda n, d, h: {"landmarks": 64},
    "reformer": lambda n, d, h: {"n_hashes": 4, "bucket_size": 64},
    "longformer": lambda n, d, h: {"window": 256},
    "bigbird": lambda n, d, h: {"block": 64},
    "local": lambda n, d, h: {"block": 256},
}

#: the constructor parameter names each setting may go by
ALIASES: dict[str, tuple[str, ...]] = {
    "k": ("k", "proj_dim", "projection_dim", "k_dim", "rank", "proj_len"),
    "max_len": ("max_len", "max_seq_len", "seq_len", "max_length", "n_max", "max_positions"),
    "features": ("features", "num_features", "nb_features", "n_features"),
    "landmarks": ("landmarks", "num_landmarks", "n_landmarks"),
    "n_hashes": ("n_hashes", "num_hashes", "hashes"),
    "bucket_size": ("bucket_size", "bucket", "bucket_len"),
    "window": ("window", "window_size", "attention_window"),
    "block": ("block", "block_size", "block_len"),
}

#: sizes filled in when a constructor takes them: parameter name -> (N, D, H) -> value
SIZES: dict[str, Callable[[int, int, int], int]] = {
    "head_dim": lambda n, d, h: d,
    "dim_head": lambda n, d, h: d,
    "heads": lambda n, d, h: h,
    "num_heads": lambda n, d, h: h,
    "max_len": lambda n, d, h: n,
    "max_seq_len": lambda n, d, h: n,
    "seq_len": lambda n, d, h: n,
}


def settings_for(cls: type, name: str, n: int, d: int, h: int) -> tuple[dict, list[str]]:
    """Constructor keywords for mechanism ``cls`` at these sizes, and notes on what was dropped."""
    wanted = SETTINGS.get(name, lambda n, d, h: {})(n, d, h)
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return wanted, []
    names = {p for p in params if p != "self"}
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs, notes = {}, []
    for key, val in wanted.items():
        hit = next((a for a in ALIASES.get(key, (key,)) if a in names), None)
        if hit is not None:
            kwargs[hit] = val
        elif var_kw:
            kwargs[key] = val
        else:
            notes.append(f"setting {key}={val} not taken by {cls.__name__}")
    for pname, fn in SIZES.items():
        if pname in names and pname not in kwargs:
            kwargs[pname] = fn(n, d, h)
    return kwargs, notes


def cases(lengths: list[int], device: str, dtype: str, B: int = 1, H: int = 8, D: int = 64,  # noqa: N803
          names: list[str] | None = None) -> list[dict]:
    """The case specs of this suite: one per registered mechanism x N x mode (no mask).

    ``names`` keeps only these mechanisms.
    """
    specs = []
    for name, cls in mechanisms().items():
        if names is not None and name not in names:
            continue
        for n in lengths:
            kwargs, notes = settings_for(cls, name, n, D, H)
            for mode in MODES:
                specs.append({"suite": SUITE, "kind": "mechanism", "name": name, "mask": "none", "N": n,
                              "B": B, "H": H, "D": D, "dtype": dtype, "device": device, "mode": mode,
                              "settings": kwargs, "notes": notes, "skip": None})
    return specs


def run_case(spec: dict) -> dict:
    """Measure one mechanism case in this process (see the module docstring)."""
    cls = mechanisms()[spec["name"]]
    try:
        mech = cls(**spec["settings"])
    except (TypeError, ValueError) as e:
        raise Unsupported(f"cannot build {spec['name']} with {spec['settings']}: {e}") from e
    mech = mech.to(spec["device"], torch_dtype(spec["dtype"])).eval()
    n, d, h, B = spec["N"], spec["D"], spec["H"], spec["B"]  # noqa: N806
    q, k, v = make_inputs(spec)
    res: dict = {}
    try:
        c = mech.cost(n, n, d, h, B)
        res["cost"] = {"flops": float(c.flops), "bytes": float(c.bytes)}
    except (NotImplementedError, TypeError, ValueError, AttributeError) as e:
        res["cost"] = None
        res["note"] = f"cost() failed: {e}"[:200]

    def fn(q, k, v):
        out = mech(q, k, v)
        return out[0] if isinstance(out, tuple) else out

    try:
        with torch.no_grad():
            fn(q, k, v)  # a first call: shapes, supported sizes
    except (ValueError, NotImplementedError) as e:
        raise Unsupported(str(e).splitlines()[0][:300]) from e
    params = [p for p in mech.parameters() if p.requires_grad]
    res.update(measure_mode(mode_op(fn, q, k, v, spec["mode"], params), spec))
    if res.get("cost") is not None:
        res["flops"] = res["cost"]["flops"] * (1.0 if spec["mode"] == "fwd" else 3.0)
    if spec["mode"] == "fwd":
        with torch.no_grad():
            out = fn(q, k, v)  # (B, H, N, D)
        rows = check_rows(n)
        res["error"] = fro_rel_error(out[:, :, rows.to(out.device)], oracle_rows(q, k, v, None, rows))
        res["error_oracle"] = f"float64 exact attention ({len(rows)} rows)"
    return res


__all__ = ["SETTINGS", "SUITE", "cases", "run_case", "settings_for"]
