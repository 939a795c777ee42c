"""Heat maps of attention weights and masks (matplotlib, the ``viz`` extra).

* :func:`plot_attention` - one map, the tutorials' picture: key tokens along x, query
  tokens along y, a colour bar, the values written in the cells of small maps.
* :func:`plot_heads` - a grid of layers x heads, optionally titled with each head's
  pattern label (:func:`attnlab.diagnostics.analysis.analyze_heads`).
* :func:`plot_mask` - where a mask allows attention, with the tile grid of a tiled
  kernel coloured by kind (empty / partial / full) so the block structure shows.

Long sequences are drawn by aggregation: above ``max_cells`` positions per axis the
map is pooled into contiguous bins (mean over the queries of a bin, sum over the keys
of a bin, so every pooled row still sums to 1) and the ticks name position ranges.
:func:`attnlab.diagnostics.stream.attention_statistics` with ``bins=`` produces the
same pooled map without the N x M matrix, for sequences where it would not fit.

Time O(N M) to pool, O(cells) to draw; memory O(N M) for the input.
Shape legend: ``L`` layers, ``H`` heads, ``N`` queries, ``M`` keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["plot_attention", "plot_heads", "plot_mask", "pool_map", "require_matplotlib"]

MATPLOTLIB_PIP = 'pip install "attnlab[viz]"  (or: pip install matplotlib)'
#: plot_mask colours (RGB in [0, 1]) of blocked / allowed pairs by tile kind (EMPTY, PARTIAL, FULL)
_KIND_LIGHT = ((1.0, 1.0, 1.0), (0.99, 0.87, 0.72), (0.80, 0.93, 0.90))
_KIND_DARK = ((0.2, 0.2, 0.2), (0.55, 0.25, 0.05), (0.05, 0.38, 0.33))


def require_matplotlib():
    """``matplotlib.pyplot``, or an ImportError naming the ``pip install`` line.

    The backend is left to matplotlib (it falls back to a non-interactive one when
    there is no display), so ``plt.show()`` keeps working in a desktop session.
    """
    try:
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError(f"attnlab.viz needs matplotlib; run: {MATPLOTLIB_PIP}") from e
    return plt


def _to_numpy(x, name: str) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().to("cpu").float().numpy()
    a = np.asarray(x, dtype=np.float64)
    while a.ndim > 2 and a.shape[0] == 1:
        a = a[0]
    if a.ndim != 2:
        raise ValueError(f"{name} must be one (N, M) map (leading size-1 dims are dropped), got shape {a.shape}")
    return a


def _edges(n: int, bins: int) -> np.ndarray:
    """Start of each of ``bins`` near-equal contiguous bins over ``range(n)``, plus ``n``."""
    return np.unique(np.append((np.arange(bins) * n) // bins, n))


def pool_map(w: np.ndarray, max_q: int, max_k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pool a ``(N, M)`` map into at most ``max_q x max_k`` cells.

    Returns:
        ``(pooled, q_edges, k_edges)``: rows are the mean over the queries of a bin,
        columns the sum over the keys of a bin; ``*_edges`` are the bin boundaries
        (``len = bins + 1``). Without pooling the edges are ``0..N`` / ``0..M``.
    """
    n, m = w.shape
    qe = _edges(n, min(n, max_q))
    ke = _edges(m, min(m, max_k))
    out = w
    if len(ke) - 1 < m:
        out = np.add.reduceat(out, ke[:-1], axis=1)  # (N, bins_k) sums over the keys of a bin
    if len(qe) - 1 < n:
        out = np.add.reduceat(out, qe[:-1], axis=0) / np.diff(qe)[:, None]  # (bins_q, .) means
    return out, qe, ke


def _tick_labels(tokens: Sequence[str] | None, edges: np.ndarray) -> list[str]:
    pooled = len(edges) - 1 < edges[-1]
    if not pooled:
        return list(tokens) if tokens is not None else [str(i) for i in range(edges[-1])]
    return [f"{a}-{b - 1}" for a, b in zip(edges[:-1], edges[1:])]


def _set_ticks(ax, axis: str, labels: list[str], fontsize: float, max_labels: int = 60) -> None:
    n = len(labels)
    step = max(1, int(np.ceil(n / max_labels)))
    pos = np.arange(0, n, step)
    if axis == "x":
        ax.set_xticks(pos)
        ax.set_xticklabels([labels[i] for i in pos], rotation=60 if n > 4 else 0, ha="right" if n > 4 else "center",
                           rotation_mode="anchor", fontsize=fontsize)
    else:
        ax.set_yticks(pos)
        ax.set_yticklabels([labels[i] for i in pos], fontsize=fontsize)


def plot_attention(
    weights,
    tokens: Sequence[str] | None = None,
    *,
    key_tokens: Sequence[str] | None = None,
    ax=None,
    title: str = "Attention Weights",
    cmap: str = "YlGnBu",
    annotate: bool | None = None,
    fmt: str = ".2f",
    max_cells: int = 256,
    vmin: float | None = 0.0,
    vmax: float | None = None,
    colorbar: bool = True,
    path: str | Path | None = None,
    dpi: int = 150,
):
    """Heat map of one attention map: queries down, keys across.

    Args:
        weights: ``(N, M)`` weights (tensor or array; leading size-1 dims are dropped).
        tokens: query tokens (``len N``); also the key tokens when ``key_tokens`` is None
            and ``N == M``.
        key_tokens: key tokens (``len M``) when they differ from the queries.
        ax: draw into this axes (default: a new figure sized to the map).
        title, cmap: as in the tutorials' picture (``"Attention Weights"``, ``"YlGnBu"``).
        annotate: write each value in its cell (default: when the drawn map has at
            most 20 x 20 cells).
        fmt: format of the annotations.
        max_cells: pool above this many positions per axis (see :func:`pool_map`).
        vmin, vmax: colour range (default 0 .. max).
        colorbar: draw a colour bar.
        path: save the figure there (PNG/SVG/PDF by suffix); the figure is closed and
            the path returned instead of the figure.
        dpi: resolution when saving.

    Returns:
        The matplotlib ``Figure`` (or ``path`` when saved).

    Raises:
        ValueError: when the weights are not one map or the tokens do not match it.
        ImportError: when matplotlib is missing (with the ``pip install`` line).
    """
    plt = require_matplotlib()
    w = _to_numpy(weights, "weights")
    n, m = w.shape
    if key_tokens is None and tokens is not None and n == m:
        key_tokens = tokens
    for name, toks, size in (("tokens", tokens, n), ("key_tokens", key_tokens, m)):
        if toks is not None and len(toks) != size:
            raise ValueError(f"{name} must have {size} entries to match weights of shape {w.shape}, got {len(toks)}")
    if not isinstance(max_cells, int) or max_cells < 1:
        raise ValueError(f"max_cells must be a positive int, got {max_cells!r}")
    pooled, qe, ke = pool_map(w, max_cells, max_cells)
    pn, pm = pooled.shape
    if ax is None:
        side_w = min(16.0, max(4.5, 0.45 * pm + 2.5))
        side_h = min(14.0, max(3.5, 0.4 * pn + 1.8))
        fig, ax = plt.subplots(figsize=(side_w, side_h), layout="constrained")
    else:
        fig = ax.figure
    im = ax.imshow(pooled, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest")
    fontsize = 9 if max(pn, pm) <= 30 else 7
    _set_ticks(ax, "x", _tick_labels(key_tokens, ke), fontsize)
    _set_ticks(ax, "y", _tick_labels(tokens, qe), fontsize)
    is_pooled = (pn, pm) != (n, m)
    ax.set_xlabel("Key Positions" + (" (binned, summed)" if is_pooled else ""))
    ax.set_ylabel("Query Positions" + (" (binned, mean)" if is_pooled else ""))
    ax.set_title(title)
    if annotate is None:
        annotate = pn * pm <= 400
    if annotate:
        hi = np.nanmax(pooled) if pooled.size else 1.0
        for i in range(pn):
            for j in range(pm):
                val = pooled[i, j]
                ax.text(j, i, format(val, fmt), ha="center", va="center", fontsize=7,
                        color="white" if val > 0.6 * (vmax if vmax is not None else hi) else "#222222")
    if colorbar:
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
    if path is not None:
        fig.savefig(path, dpi=dpi)
        plt.close(fig)
        return Path(path)
    return fig


def plot_heads(
    weights_per_layer,
    tokens: Sequence[str] | None = None,
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    stats: Sequence | None = None,
    batch_index: int = 0,
    cmap: str = "YlGnBu",
    max_cells: int = 128,
    panel_size: float = 1.6,
    path: str | Path | None = None,
    dpi: int = 120,
):
    """A grid of attention maps, one row per layer and one column per head.

    Args:
        weights_per_layer: a sequence of ``(B, H, N, M)`` / ``(H, N, M)`` tensors, one per
            layer, or one ``(L, H, N, M)`` tensor.
        tokens: tokens of the sequence, shown on the outer panels when ``N <= 24``.
        layers, heads: which to draw (default all).
        stats: :class:`~attnlab.diagnostics.analysis.HeadStats` list; each panel is then
            titled with its pattern label and abnormal heads are framed in red.
        batch_index: which batch element to draw.
        max_cells: pool each map above this many positions per axis.
        panel_size: inches per panel.
        path: save there and return the path (the figure is closed).

    Returns:
        The ``Figure`` (or ``path``).
    """
    plt = require_matplotlib()
    maps = []
    seq = list(weights_per_layer) if isinstance(weights_per_layer, (list, tuple)) else None
    if seq is None:
        arr = weights_per_layer.detach().cpu() if hasattr(weights_per_layer, "detach") else np.asarray(weights_per_layer)
        if arr.ndim != 4:
            raise ValueError(f"weights_per_layer must be a sequence of (B, H, N, M) or one (L, H, N, M), got shape {tuple(arr.shape)}")
        seq = [arr[i] for i in range(arr.shape[0])]
    if not seq:
        raise ValueError("weights_per_layer must hold at least one layer")
    for i, w in enumerate(seq):
        a = w.detach().cpu().float().numpy() if hasattr(w, "detach") else np.asarray(w, dtype=np.float64)
        if a.ndim == 4:
            if not 0 <= batch_index < a.shape[0]:
                raise ValueError(f"batch_index must be in [0, {a.shape[0]}), got {batch_index}")
            a = a[batch_index]
        if a.ndim != 3:
            raise ValueError(f"weights_per_layer[{i}] must be (B, H, N, M) or (H, N, M), got shape {a.shape}")
        maps.append(a)  # (H, N, M)
    n_layers, n_heads = len(maps), maps[0].shape[0]
    layers = list(range(n_layers)) if layers is None else list(layers)
    heads = list(range(n_heads)) if heads is None else list(heads)
    for name, sel, top in (("layers", layers, n_layers), ("heads", heads, n_heads)):
        bad = [x for x in sel if not 0 <= x < top]
        if bad or not sel:
            raise ValueError(f"{name} must be a non-empty selection within [0, {top}), got {sel}")
    by_key = {(s.layer, s.head): s for s in stats} if stats is not None else {}
    n, m = maps[0].shape[1:]
    show_tokens = tokens is not None and max(n, m) <= 24
    fig, axes = plt.subplots(len(layers), len(heads), figsize=(panel_size * len(heads) + 1.0, panel_size * len(layers) + 0.8),
                             squeeze=False, layout="constrained")
    for r, li in enumerate(layers):
        for c, hi in enumerate(heads):
            ax = axes[r][c]
            pooled, _, _ = pool_map(maps[li][hi], max_cells, max_cells)
            ax.imshow(pooled, cmap=cmap, vmin=0.0, aspect="auto", interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            s = by_key.get((li, hi))
            if s is not None:
                ax.set_title(f"{s.label} {s.score:.2f}", fontsize=7, color="#b00020" if s.abnormal else "#333333", pad=2)
                if s.abnormal:
                    for sp in ax.spines.values():
                        sp.set_edgecolor("#b00020")
                        sp.set_linewidth(2)
            if r == len(layers) - 1:
                ax.set_xlabel(f"head {hi}", fontsize=8)
                if show_tokens:
                    ax.set_xticks(range(m))
                    ax.set_xticklabels(list(tokens)[:m], rotation=90, fontsize=5)
            if c == 0:
                ax.set_ylabel(f"layer {li}", fontsize=8)
                if show_tokens:
                    ax.set_yticks(range(n))
                    ax.set_yticklabels(list(tokens)[:n], fontsize=5)
    fig.suptitle("Attention per layer (rows) and head (columns): queries down, keys across", fontsize=10)
    if path is not None:
        fig.savefig(path, dpi=dpi)
        plt.close(fig)
        return Path(path)
    return fig


def _mask_fraction(mask, n: int, m: int, qe: np.ndarray, ke: np.ndarray, batch_index: int, head_index: int) -> np.ndarray:
    """Fraction of allowed (query, key) pairs in each (query bin, key bin), row chunk by row chunk."""
    import torch

    out = np.zeros((len(qe) - 1, len(ke) - 1))
    for r, (q0, q1) in enumerate(zip(qe[:-1], qe[1:])):
        t = mask.tile(int(q0), int(q1), 0, m, n, m)  # (B'|1, H'|1, bq|1, M|1)
        t = t[min(batch_index, t.shape[0] - 1), min(head_index, t.shape[1] - 1)]
        t = t.expand(int(q1 - q0), m).to(torch.float64).numpy()  # (bq, M)
        cols = np.add.reduceat(t.sum(0), ke[:-1])  # (bins_k,)
        out[r] = cols / ((q1 - q0) * np.diff(ke))
    return out


def plot_mask(
    mask,
    n: int,
    m: int | None = None,
    *,
    block: int | tuple[int, int] | None = None,
    batch_index: int = 0,
    head_index: int = 0,
    max_cells: int = 512,
    title: str | None = None,
    ax=None,
    path: str | Path | None = None,
    dpi: int = 150,
):
    """Draw what a mask allows (dark = may attend) for ``n`` queries and ``m`` keys.

    Args:
        mask: an :class:`attnlab.masks.Mask` or a boolean tensor broadcastable to
            ``(B, H, n, m)``.
        n, m: numbers of queries and keys (``m`` defaults to ``n``).
        block: tile size (``(block_q, block_k)`` or one int for both); each tile is
            outlined and tinted by :meth:`~attnlab.masks.Mask.block_kinds` (green full,
            orange partial, white empty). Default: ``n // 8`` rounded to a power of 2.
        batch_index, head_index: which batch element / head to draw for masks that depend on them.
        max_cells: above this many positions per axis the picture shows the allowed
            fraction of each bin instead of single pairs.
        title: default names the mask.
        path: save there and return the path.

    Returns:
        The ``Figure`` (or ``path``).
    """
    import torch

    from ..masks import as_mask

    plt = require_matplotlib()
    m = n if m is None else m
    for name, val in (("n", n), ("m", m)):
        if not isinstance(val, int) or val < 1:
            raise ValueError(f"{name} must be a positive int, got {val!r}")
    mk = as_mask(mask, "mask")
    if mk is None:
        raise ValueError("mask must be a Mask or a boolean tensor, got None")
    qe, ke = _edges(n, min(n, max_cells)), _edges(m, min(m, max_cells))
    frac = _mask_fraction(mk, n, m, qe, ke, batch_index, head_index)
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.4, 6.4 * min(2.0, max(0.4, n / m)) + 0.6), layout="constrained")
    else:
        fig = ax.figure
    if block is None:
        b = max(1, n // 8)
        block = 1 << (b.bit_length() - 1)
    bq, bk = (block, block) if isinstance(block, int) else block
    kinds = mk.block_kinds(n, m, bq, bk, device="cpu")  # (B'|1, H'|1, nqb|1, nkb|1)
    kinds = kinds[min(batch_index, kinds.shape[0] - 1), min(head_index, kinds.shape[1] - 1)]
    nqb, nkb = -(-n // bq), -(-m // bk)
    kinds = kinds.expand(nqb, nkb).to(torch.int64).numpy()
    # colour every drawn cell by the kind of the tile holding it: blocked pairs take the
    # tile's light tint, allowed pairs its dark shade, mixed bins blend the two
    cell_kind = kinds[np.minimum(qe[:-1] // bq, nqb - 1)][:, np.minimum(ke[:-1] // bk, nkb - 1)]  # (bins_q, bins_k)
    light = np.array([_KIND_LIGHT[k] for k in range(3)])[cell_kind]  # (bins_q, bins_k, 3)
    dark = np.array([_KIND_DARK[k] for k in range(3)])[cell_kind]
    rgb = light + (dark - light) * frac[..., None]
    ax.imshow(rgb, extent=(-0.5, m - 0.5, n - 0.5, -0.5), aspect="auto", interpolation="nearest")
    if nqb * nkb <= 128 * 128:
        for i in range(1, nqb):
            ax.axhline(i * bq - 0.5, color="#888888", linewidth=0.5)
        for j in range(1, nkb):
            ax.axvline(j * bk - 0.5, color="#888888", linewidth=0.5)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(facecolor=_KIND_DARK[2], label="allowed, full tile"),
                       Patch(facecolor=_KIND_DARK[1], label="allowed, partial tile"),
                       Patch(facecolor=_KIND_LIGHT[1], edgecolor="#888888", label="blocked, partial tile"),
                       Patch(facecolor=_KIND_LIGHT[0], edgecolor="#888888", label="blocked, empty tile (skipped)")],
              loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=2, fontsize=8, frameon=False)
    counts = [(kinds == k).sum() for k in range(3)]
    ax.set_xlabel("Key Positions")
    ax.set_ylabel("Query Positions")
    ax.set_title(title or f"{mk!r}\n{n}x{m}, tiles {bq}x{bk}: {counts[2]} full, {counts[1]} partial, {counts[0]} empty",
                 fontsize=9)
    if path is not None:
        fig.savefig(path, dpi=dpi)
        plt.close(fig)
        return Path(path)
    return fig
