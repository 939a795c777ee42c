"""Graph attention against PyTorch Geometric: speed on Cora, memory at 2 million edges, the density threshold.

    python scripts/graph_vs_pyg.py speed   [--threads 1] [--repeats 40] [--clock wall|cpu]
    python scripts/graph_vs_pyg.py memory  [--nodes 100000 --edges 2000000]
    python scripts/graph_vs_pyg.py density [--nodes 1024 2048]
    python scripts/graph_vs_pyg.py all

speed: a 2-layer GAT on Cora (8 heads x 8, ELU, 7 classes, dropout 0.6 on the features and the
attention), one training step (forward + backward), PyG's and attnlab's alternated in one process,
medians. Three comparisons: (a) the same model code with ``torch_geometric.nn.GATConv`` or
``attnlab.layers.GATConv`` (dense features, as PyG's example; its feature dropout and first
projection, common to both, take most of the time); (b) the two layers alone, the same code without
the feature dropout (attention dropout kept); (c) the model as ``attnlab train cora`` runs it
(:class:`attnlab.models.GAT`, sparse features) against (a)'s PyG model. The ratio is attnlab's time
over PyG's.

memory: one GATConv layer (64 -> 8 heads x 8) trained forward + backward on a random graph of
``--nodes`` nodes and ``--edges`` edges (plus a self-loop per node), each in a fresh process: the
process's peak resident memory above what it held before the step (``ru_maxrss``).

density: attention with ``masks.graph`` on random graphs of N nodes (8 heads, head dim 64, float32,
forward + backward) through the ``edges`` backend and through the fastest dense backend serving it
(``sdpa`` or ``chunked``), alternated, at densities from 0.25% to 32%; the crossover, interpolated in
log density, is what ``attnlab.exact.edges.DENSITY_THRESHOLD`` records.

torch_geometric is needed for speed and memory (``pip install torch_geometric``); it is a test and
benchmark dependency of attnlab, never a runtime one. Timings on a shared machine are noisy: only
the ratios of alternated runs mean anything.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


#: the clock of the timings: ``wall`` (time.perf_counter) or ``cpu`` (this thread's CPU time, which a machine
#: shared with other jobs inflates far less; meaningful with --threads 1)
CLOCK = {"wall": time.perf_counter, "cpu": time.thread_time}
_clock = time.perf_counter


def _median_ms(fns: dict, repeats: int) -> dict[str, float]:
    """Alternate the functions ``repeats`` times (order flipped every round); median milliseconds of each."""
    for f in fns.values():
        for _ in range(3):
            f()
    times = {k: [] for k in fns}
    names = list(fns)
    for r in range(repeats):
        for k in (names if r % 2 else names[::-1]):
            t = _clock()
            fns[k]()
            times[k].append(_clock() - t)
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


def speed(args) -> dict:
    import torch_geometric.nn as pyg

    from attnlab.layers import GATConv
    from attnlab.models import GAT, GATConfig
    from attnlab.tasks import create_task

    torch.set_num_threads(args.threads)
    task = create_task("cora", data=args.data)
    task.ensure_setup()
    g = task.graph
    x_sparse, ei, y, m = g.x, g.edge_index, g.y, g.train_mask
    x = x_sparse.to_dense()

    class Net(torch.nn.Module):  # PyG's examples/gat.py
        def __init__(self, conv, feature_dropout=0.6):
            super().__init__()
            self.p = feature_dropout
            self.conv1 = conv(g.num_features, 8, heads=8, dropout=0.6)
            self.conv2 = conv(64, g.num_classes, heads=1, concat=False, dropout=0.6)

        def forward(self, x, ei):
            x = F.dropout(x, self.p, self.training)
            x = F.elu(self.conv1(x, ei))
            x = F.dropout(x, self.p, self.training)
            return self.conv2(x, ei)

    torch.manual_seed(0)
    theirs = Net(pyg.GATConv).train()
    ours = Net(GATConv).train()
    ours.load_state_dict(theirs.state_dict())
    theirs_bare, ours_bare = Net(pyg.GATConv, 0.0).train(), Net(GATConv, 0.0).train()
    ours_bare.load_state_dict(theirs_bare.state_dict())
    model = GAT(GATConfig(in_channels=g.num_features, num_classes=g.num_classes)).train()

    def step(net, feats, logits=lambda o: o):
        net.zero_grad(set_to_none=True)
        F.cross_entropy(logits(net(feats, ei))[m], y[m]).backward()

    ms = _median_ms({"pyg": lambda: step(theirs, x), "attnlab_layers": lambda: step(ours, x),
                     "pyg_bare": lambda: step(theirs_bare, x), "attnlab_bare": lambda: step(ours_bare, x),
                     "attnlab_model": lambda: step(model, x_sparse, lambda o: o.logits)}, args.repeats)
    out = {"threads": args.threads, "repeats": args.repeats, "clock": args.clock,
           "ms": {k: round(v, 2) for k, v in ms.items()},
           "ratio_same_model": round(ms["attnlab_layers"] / ms["pyg"], 3),
           "ratio_layers_alone": round(ms["attnlab_bare"] / ms["pyg_bare"], 3),
           "ratio_attnlab_model": round(ms["attnlab_model"] / ms["pyg"], 3)}
    print(f"speed, 2-layer GAT on Cora, one training step (fwd+bwd), {args.threads} thread(s), {args.clock} time, "
          f"median of {args.repeats} alternated runs:")
    print(f"  (a) PyG's example model, PyG GATConv         {ms['pyg']:8.2f} ms")
    print(f"      the same model, attnlab GATConv          {ms['attnlab_layers']:8.2f} ms   "
          f"ratio {out['ratio_same_model']:.2f}x")
    print(f"  (b) without feature dropout, PyG GATConv     {ms['pyg_bare']:8.2f} ms")
    print(f"      without feature dropout, attnlab         {ms['attnlab_bare']:8.2f} ms   "
          f"ratio {out['ratio_layers_alone']:.2f}x")
    print(f"  (c) attnlab's GAT model (sparse features)    {ms['attnlab_model']:8.2f} ms   "
          f"ratio {out['ratio_attnlab_model']:.2f}x (against (a)'s PyG)")
    return out


def _memory_child(which: str, nodes: int, edges: int, threads: int) -> None:
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    ei = torch.stack([torch.randint(0, nodes, (edges,), generator=g), torch.randint(0, nodes, (edges,), generator=g)])
    x = torch.randn(nodes, 64, generator=g)
    if which == "pyg":
        import torch_geometric.nn as pyg

        conv = pyg.GATConv(64, 8, heads=8, dropout=0.6)
    else:
        from attnlab.layers import GATConv

        conv = GATConv(64, 8, heads=8, dropout=0.6)
    conv.train()
    conv(x[:10], ei[:, :0])  # imports and first-call set-up outside the measurement
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t = time.perf_counter()
    conv(x, ei).sum().backward()
    seconds = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"which": which, "peak_gib": (peak - before) / 2**30, "seconds": seconds}))


def memory(args) -> dict:
    out = {"nodes": args.nodes, "edges": args.edges}
    for which in ("attnlab", "pyg"):
        cmd = [sys.executable, __file__, "_memory_child", which, str(args.nodes), str(args.edges), str(args.threads)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            out[which] = {"error": (res.stderr.strip().splitlines() or ["failed"])[-1]}
            continue
        out[which] = json.loads(res.stdout.strip().splitlines()[-1])
    print(f"memory, one GATConv layer (64 -> 8 x 8) fwd+bwd, {args.nodes:,} nodes, {args.edges:,} random edges "
          f"(+ self-loops), peak resident memory above the process's before the step:")
    for which in ("attnlab", "pyg"):
        r = out[which]
        print(f"  {which:8s} " + (f"{r['peak_gib']:.2f} GiB in {r['seconds']:.1f} s" if "peak_gib" in r
                                  else f"failed: {r['error']}"))
    return out


def density(args) -> dict:
    from attnlab import attention, masks

    torch.set_num_threads(args.threads)
    H, D = 8, 64
    results = []
    for n in args.nodes:
        g = torch.Generator().manual_seed(n)
        q, k, v = (torch.randn(1, H, n, D, generator=g).requires_grad_() for _ in range(3))
        rows = []
        for d in (0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32):
            e = max(1, int(d * n * n))
            mask = masks.graph(torch.stack([torch.randint(0, n, (e,), generator=g),
                                            torch.randint(0, n, (e,), generator=g)]), num_nodes=n)
            real = mask.density(n, n)

            def run(backend, mask=mask, q=q, k=k, v=v):
                out = attention(q, k, v, mask=mask, backend=backend)
                out.sum().backward()

            ms = _median_ms({b: (lambda b=b: run(b)) for b in ("edges", "sdpa", "chunked")}, args.repeats)
            dense = min(ms["sdpa"], ms["chunked"])
            rows.append({"density": real, "edges_ms": ms["edges"], "sdpa_ms": ms["sdpa"], "chunked_ms": ms["chunked"],
                         "ratio": ms["edges"] / dense})
            print(f"  N={n:5d} density {real:7.2%}: edges {ms['edges']:8.2f} ms, sdpa {ms['sdpa']:8.2f} ms, "
                  f"chunked {ms['chunked']:8.2f} ms -> edges / fastest dense {ms['edges'] / dense:5.2f}")
        cross = None
        for a, b in zip(rows, rows[1:]):
            if a["ratio"] <= 1.0 < b["ratio"]:  # interpolate log(ratio) against log(density)
                t = -math.log(a["ratio"]) / (math.log(b["ratio"]) - math.log(a["ratio"]))
                cross = math.exp(math.log(a["density"]) + t * (math.log(b["density"]) - math.log(a["density"])))
        results.append({"nodes": n, "rows": rows, "crossover": cross})
        print(f"  N={n}: edges is faster below {cross:.2%} density" if cross else f"  N={n}: no crossover in range")
    found = [r["crossover"] for r in results if r["crossover"]]
    out = {"heads": H, "head_dim": D, "threads": args.threads, "results": results,
           "threshold": min(found) if found else None}
    if found:
        print(f"density threshold (the lowest crossover): {min(found):.2%}")
    return out


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "_memory_child":
        _memory_child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("speed", "memory", "density", "all"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--clock", choices=sorted(CLOCK), default="wall",
                   help="wall time, or this thread's CPU time (steadier on a shared machine; use with --threads 1)")
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--data", default=None, help="cora.npz or a folder holding it (default: the copy attnlab data fetch cora made)")
    p.add_argument("--nodes", type=int, nargs="+", default=None)
    p.add_argument("--edges", type=int, default=2_000_000)
    p.add_argument("--json", default=None, help="also write the results to this file")
    args = p.parse_args(argv)
    global _clock
    _clock = CLOCK[args.clock]
    results = {}
    if args.what in ("speed", "all"):
        results["speed"] = speed(args)
    if args.what in ("memory", "all"):
        args.nodes_mem = args.nodes[0] if args.nodes and args.what == "memory" else 100_000
        ns = argparse.Namespace(**{**vars(args), "nodes": args.nodes_mem})
        results["memory"] = memory(ns)
    if args.what in ("density", "all"):
        ns = argparse.Namespace(**{**vars(args), "nodes": args.nodes if args.what == "density" and args.nodes
                                   else [1024, 2048], "repeats": min(args.repeats, 10)})
        results["density"] = density(ns)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
