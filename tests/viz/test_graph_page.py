"""The graph attention page and the --node paths of attnlab analyze / view."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.cli import main
from attnlab.diagnostics.graph import analyze_graph_model
from attnlab.models import GAT, GATConfig
from attnlab.viz.graph_page import graph_page_html
from helpers import random_edges


def _report(conv: str, name: str):
    torch.manual_seed(0)
    model = GAT(GATConfig(in_channels=5, num_classes=3, hidden=2, heads=2, conv=conv))
    return analyze_graph_model(model, torch.randn(20, 5), random_edges(20, seed=2), 4, name=name, queries=8, keys=8)


def test_the_page_shows_both_models_side_by_side():
    page = graph_page_html([_report("gat", "GAT run"), _report("gatv2", "GATv2 run")], title="node 4")
    assert page.startswith("<!doctype html>") and "<script" not in page
    assert "GAT run" in page and "GATv2 run" in page and "(self)" in page
    assert page.count('class="static"') == 3 and 'class="dynamic"' in page
    with pytest.raises(ValueError, match="about one node"):
        other = _report("gat", "x")
        other.node = 5
        graph_page_html([_report("gat", "a"), other])


# every test of this file runs on one xdist worker (scripts/test.sh: --dist loadgroup), which builds its fixture once
pytestmark = pytest.mark.xdist_group("test_graph_page")


@pytest.fixture(scope="session")  # once per worker: a module fixture is rebuilt when the queue moves away and back
def runs(tmp_path_factory, planetoid):
    planetoid("cora")
    out = tmp_path_factory.mktemp("runs")
    for conv in ("gat", "gatv2"):
        assert main(["train", "cora", "--steps", "2", "--out", str(out / conv), "--quiet", "--threads", "1",
                     "--model", f"conv={conv},heads=2"]) == 0
    return out


def test_analyze_and_view_a_graph_checkpoint(runs, tmp_path, capsys):
    capsys.readouterr()
    assert main(["analyze", str(runs / "gat"), "--node", "7", "--against", str(runs / "gatv2"), "--top", "3"]) == 0
    text = capsys.readouterr().out
    assert "node 7" in text and "3 of 3 heads rank the keys the same way" in text and "(gatv2)" in text
    assert main(["analyze", str(runs / "gat"), "--node", "7", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data[0]["node"] == 7 and len(data[0]["heads"]) == 3
    page = tmp_path / "n7.html"
    assert main(["view", str(runs / "gat"), "--node", "7", "--against", str(runs / "gatv2"), "--out", str(page)]) == 0
    assert "wrote" in capsys.readouterr().out and "discordance" in page.read_text()


def test_graph_errors_are_one_line(runs, tmp_path, capsys):
    capsys.readouterr()
    assert main(["analyze", str(runs / "gat"), "some text", "--node", "1"]) == 2
    assert "with --node give exactly one CHECKPOINT" in capsys.readouterr().err
    assert main(["analyze", str(runs / "gat"), "--node", "99999"]) == 2
    err = capsys.readouterr().err
    assert "node must be a node id in [0, 2708)" in err and len(err.strip().splitlines()) == 1
