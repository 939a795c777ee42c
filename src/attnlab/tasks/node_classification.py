"""Node classification on the Planetoid citation graphs: ``attnlab train cora`` and ``attnlab train citeseer``.

Transductive, full-batch: every step is one forward of the whole graph, the loss is the
cross-entropy on the labelled training nodes (140 Cora, 120 CiteSeer), and evaluation reads
the validation (500) or test (1,000) nodes' accuracy off the same forward. The defaults
are the GAT paper's (Veličković et al., 2018, section 3.3): row-normalized features, the
:class:`~attnlab.models.GAT` of :class:`~attnlab.models.config.GATConfig`'s defaults, Adam
at lr 0.005 with an L2 penalty of 5e-4 on the weights, and early stopping on the validation
loss with a patience of 100 epochs, keeping the best epoch's weights. ``--seeds 10`` runs
ten seeds and reports mean and standard deviation, as the paper does (over 100 runs).

Data: the converted graph ``{cora,citeseer}.npz`` that ``attnlab data fetch cora`` (or
``citeseer``) writes after checking the published files' SHA-256; ``--data`` names that file
or a folder holding it (or a ``planetoid`` folder), default ``$ATTNLAB_DATA``, then the cache.
Read by :func:`attnlab.data.planetoid.load_planetoid` (``allow_pickle=False``).
Time per step O(N F H C + E H C); memory O(N F + E H).
Shape legend: ``N`` nodes, ``F`` features, ``E`` edges, ``H`` heads, ``C`` channels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from ..data import MissingDataError, locate
from ..data.planetoid import PlanetoidGraph, load_planetoid
from ..utils import to_sparse_csr
from .base import Task, register_task

__all__ = ["CiteSeerTask", "CoraTask", "NodeClassificationTask"]



class NodeClassificationTask(Task):
    """Full-batch node classification on one Planetoid graph (subclasses set ``name``)."""

    model_type = "GAT"
    option_defaults: dict[str, Any] = {"normalize_features": True, "sparse_features": True}
    model_defaults: dict[str, Any] = {}
    train_defaults: dict[str, Any] = {"steps": 10_000, "lr": 0.005, "weight_decay": 5e-4, "optimizer": "adam",
                                      "schedule": "constant", "warmup": 0, "grad_clip": 0.0, "eval_every": 1,
                                      "eval_batches": 0, "early_stopping_patience": 100, "precision": "fp32",
                                      "batch_size": 1, "log_every": 10}
    item_unit = "node"
    graph: PlanetoidGraph

    def setup(self) -> None:
        g = load_planetoid(self._graph_file(), self.name)
        if self.options["normalize_features"]:  # each row sums to 1 (papers without words stay zero)
            g.x = g.x / g.x.sum(1, keepdim=True).clamp_min(1.0)
        if self.options["sparse_features"]:  # about 1% nonzero: the first layer's dropout and product cost O(nnz)
            g.x = to_sparse_csr(g.x)
        self.graph = g

    def _graph_file(self) -> Path:
        """The ``.npz`` to read: ``--data`` (the file, or a folder holding it or a ``planetoid`` one), else the cache's."""
        if self.data is None:
            return locate(self.name) / f"{self.name}.npz"
        p = Path(self.data).expanduser()
        for cand in (p, p / f"{self.name}.npz", p / "planetoid" / f"{self.name}.npz"):
            if cand.is_file():
                if cand.suffix != ".npz":
                    break
                return cand
        raw = p if p.is_dir() else p.parent
        if any(raw.glob(f"ind.{self.name}.*")):
            raise MissingDataError(f"task {self.name!r}: {str(raw)!r} holds the published Planetoid files; import "
                                   f"them once with: attnlab data fetch {self.name} --from {raw}")
        raise MissingDataError(f"task {self.name!r} found no {self.name}.npz at {str(p)!r}; run: attnlab data fetch "
                               f"{self.name} (or drop --data to use the fetched copy)")

    def model_config(self) -> dict[str, Any]:
        self.ensure_setup()
        return {"in_channels": self.graph.num_features, "num_classes": self.graph.num_classes}

    def global_batch(self, step: int, batch_size: int) -> dict[str, Tensor]:
        """The whole graph, every step (``batch_size`` does not apply to full-batch training)."""
        g = self.graph
        return {"x": g.x, "edge_index": g.edge_index, "y": g.y, "train_mask": g.train_mask}

    def items_per_batch(self, batch: dict[str, Tensor]) -> int:
        return int(batch["train_mask"].sum())

    def loss(self, model: nn.Module, batch: dict[str, Tensor], *, label_smoothing: float = 0.0,
             return_weights: bool = False):
        out = model(batch["x"], batch["edge_index"])
        m = batch["train_mask"]
        return F.cross_entropy(out.logits[m].float(), batch["y"][m], label_smoothing=label_smoothing), None

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str = "val", *, batch_size: int = 64,
                 max_batches: int | None = None, final: bool = False) -> dict[str, float]:
        """Cross-entropy and accuracy on the nodes of ``split`` (``train``, ``val``, ``test``), one full forward."""
        self.ensure_setup()
        if split not in ("train", "val", "test"):
            raise ValueError(f"split must be 'train', 'val' or 'test', got {split!r}")
        g = self.graph
        device = next(model.parameters()).device
        logits = model(g.x.to(device), g.edge_index.to(device)).logits.float()
        m = getattr(g, f"{split}_mask").to(device)
        y = g.y.to(device)[m]
        return {"loss": float(F.cross_entropy(logits[m], y)), "accuracy": float((logits[m].argmax(-1) == y).float().mean())}


@register_task
class CoraTask(NodeClassificationTask):
    """Cora: 2,708 papers, 1,433 features, 7 classes, 10,556 directed edges."""

    name = "cora"


@register_task
class CiteSeerTask(NodeClassificationTask):
    """CiteSeer: 3,327 papers, 3,703 features, 6 classes, 9,104 directed edges."""

    name = "citeseer"
