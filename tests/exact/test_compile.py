"""The native kernel under ``torch.compile`` and ``torch.export``.

The kernel's two ops (``attnlab_native::forward`` and ``::backward``) have fake kernels, so
dynamo traces a model through them with no graph break and AOTAutograd puts them in the
forward and backward graphs. Checked here: the fake kernels' shapes (``opcheck``), a
``MultiHeadAttention`` and a ``CausalLM`` with the ``native`` backend forced, compiled with
``fullgraph=True`` (0 graph breaks, counted by ``torch._dynamo.explain``), forward and
backward equal to eager within 1e-5, and the native ops in the compiled graphs;
``torch.export`` of an ``Encoder``; and (slow) the same under the ``inductor`` backend.
Tiny shapes: the cost is the compile, a few seconds per model on ``aot_eager``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab.exact import native_build
from attnlab.layers import MultiHeadAttention
from attnlab.mechanisms import Exact
from attnlab.models import GAT, CausalLM, CausalLMConfig, Encoder, GATConfig, TransformerConfig

TOL = 1e-5


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def native():
    why = native_build.status()
    if why is not None:
        pytest.skip(f"the native kernel is not available: {why}")


class _Recorder:
    """An ``aot_eager`` backend that keeps the op names of every forward and backward graph it compiles."""

    def __init__(self):
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd

        self.forward_ops: set[str] = set()
        self.backward_ops: set[str] = set()
        self.graphs = 0  # dynamo graphs compiled (a graph break makes two)

        def keep(into):
            def compiler(gm, _inputs):
                into.update(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
                return make_boxed_func(gm.forward)
            return compiler

        aot = aot_autograd(fw_compiler=keep(self.forward_ops), bw_compiler=keep(self.backward_ops))

        def backend(gm, inputs):
            self.graphs += 1
            return aot(gm, inputs)

        self.backend = backend


def _graph_breaks(fn, *args) -> int:
    explained = torch._dynamo.explain(fn)(*args)
    torch._dynamo.reset()
    return explained.graph_break_count


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().abs().max())


def _check_compiled(model: nn.Module, run, *args, backend=None) -> dict[str, float]:
    """``run(model, *args)`` compiled (fullgraph) and eager: outputs and every gradient within TOL; the errors."""
    compiled = torch.compile(model, fullgraph=True, backend=backend or "aot_eager")
    errors = {}
    outs, grads = [], []
    for m in (compiled, model):
        model.zero_grad(set_to_none=True)
        leaves = [a for a in args if a.requires_grad]
        for a in leaves:
            a.grad = None
        out = run(m, *args)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        outs.append(out.detach())
        grads.append([p.grad.clone() for p in (*leaves, *model.parameters()) if p.grad is not None])
    errors["out"] = _max_diff(*outs)
    assert len(grads[0]) == len(grads[1]) > 0
    errors["grad"] = max(_max_diff(a, b) for a, b in zip(*grads))
    assert errors["out"] <= TOL and errors["grad"] <= TOL, errors
    return errors


def _mha() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return MultiHeadAttention(16, 2, mechanism=Exact(backend="native")), torch.randn(2, 8, 16, requires_grad=True)


def test_fake_kernels_give_the_ops_shapes(native):
    ops = torch.ops.attnlab_native
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 6)
    rel = torch.randn(1, 5 + 7 - 1)
    fwd = (q, k, v, None, None, None, None, None, None, rel, 0.3, 64, 64)
    torch.library.opcheck(ops.forward.default, fwd, test_utils=("test_schema", "test_faketensor"))
    out, lse = ops.forward(*fwd)
    for rel_grad in (True, False):
        bwd = (torch.randn_like(out), q, k, v, out, lse, None, None, None, None, None, None, rel, rel_grad, 0.3,
               64, 64)
        torch.library.opcheck(ops.backward.default, bwd, test_utils=("test_schema", "test_faketensor"))


def test_multihead_attention_compiles_with_no_graph_break(native):
    model, x = _mha()
    assert _graph_breaks(model, x) == 0
    rec = _Recorder()
    _check_compiled(model, lambda m, x: m(x), x, backend=rec.backend)
    assert "attnlab_native.forward.default" in rec.forward_ops  # the native kernel, not a fallback
    assert "attnlab_native.backward.default" in rec.backward_ops


def test_causal_lm_compiles_with_no_graph_break(native):
    torch.manual_seed(0)
    cfg = CausalLMConfig(vocab_size=40, dim=16, heads=2, layers=2, mechanism_settings={"backend": "native"})
    model = CausalLM(cfg)
    tokens = torch.randint(0, 40, (2, 10))
    assert _graph_breaks(lambda t: model(t).logits, tokens) == 0
    rec = _Recorder()
    _check_compiled(model, lambda m, t: m(t).logits, tokens, backend=rec.backend)
    assert "attnlab_native.forward.default" in rec.forward_ops
    assert "attnlab_native.backward.default" in rec.backward_ops


@pytest.mark.parametrize(("conv", "training"), [("gat", False), ("gatv2", False), ("transformer", False),
                                                ("gat", True)])
def test_gat_compiles_with_no_graph_break(conv, training):
    """The edges kernel and the layers' edge lists are custom ops (sizes from the edges' values: unbacked).

    explain() compiles without fullgraph, where dynamo breaks at ops whose output sizes depend on data;
    fullgraph=True allows them, so the count is the recorder's: one graph. In training the dropout
    draws replay eager's in order (the same seed gives the same masks). ``message_dropout`` stays 0:
    aot_eager's backward of dropout then ``transpose(...).contiguous()`` fails in torch itself (a
    stride mismatch, also without attnlab).
    """
    torch.manual_seed(0)
    p = 0.3 if training else 0.0
    cfg = GATConfig(in_channels=8, num_classes=3, hidden=4, heads=2, conv=conv, dropout=p, attn_dropout=p,
                    message_dropout=0.0)
    model = GAT(cfg).train(training)
    x = torch.randn(12, 8)
    edges = torch.randint(0, 12, (2, 30))
    rec = _Recorder()

    def run(m, x):
        torch.manual_seed(1)
        return m(x, edges).logits

    _check_compiled(model, run, x, backend=rec.backend)
    assert rec.graphs == 1
    assert {"attnlab.graph_edges.default", "attnlab.edge_attention.default"} <= rec.forward_ops
    assert "attnlab.edge_attention_backward.default" in rec.backward_ops
    if not training:  # another graph (another edge count): the same compiled code, right again
        other = torch.randint(0, 12, (2, 41))
        compiled = torch.compile(model, fullgraph=True, backend=rec.backend)
        assert _max_diff(compiled(x, other).logits, model(x, other).logits) <= TOL


class _Hidden(nn.Module):
    """An encoder's last hidden state (export's output is a tensor, not the output dataclass)."""

    def __init__(self, encoder: Encoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x).last_hidden_state


def _ops_of(gm: torch.fx.GraphModule) -> set[str]:
    return {str(n.target) for m in gm.modules() if isinstance(m, torch.fx.GraphModule) for n in m.graph.nodes
            if n.op == "call_function"}


def test_an_encoder_exports_and_equals_eager(native):
    torch.manual_seed(0)
    cfg = TransformerConfig(dim=16, heads=2, layers=2, mechanism_settings={"backend": "native"})
    model = _Hidden(Encoder(cfg)).eval()
    x = torch.randn(2, 10, 16)
    exported = torch.export.export(model, (x,))
    assert "attnlab_native.forward.default" in _ops_of(exported.graph_module)
    with torch.no_grad():
        want = model(x)
        assert _max_diff(exported.module()(x), want) <= TOL
        x2 = torch.randn(2, 10, 16)
        assert _max_diff(exported.module()(x2), model(x2)) <= TOL


def test_turning_the_kernel_off_recompiles(native):
    """set_native_enabled is read outside the traced constant: a compiled model sees the change (a guard)."""
    model, x = _mha()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    compiled(x)
    native_build.set_native_enabled(False)
    try:
        with pytest.raises(Exception, match="turned off"):  # the forced backend refuses (dynamo wraps the error)
            compiled(x)
    finally:
        native_build.set_native_enabled(True)


@pytest.mark.slow
def test_multihead_attention_under_inductor(native):
    model, x = _mha()
    _check_compiled(model, lambda m, x: m(x), x, backend="inductor")


@pytest.mark.slow
def test_gat_under_inductor():
    torch.manual_seed(0)
    model = GAT(GATConfig(in_channels=8, num_classes=3, hidden=4, heads=2, dropout=0.0, attn_dropout=0.0,
                          message_dropout=0.0)).eval()
    edges = torch.randint(0, 12, (2, 30))
    _check_compiled(model, lambda m, x: m(x, edges).logits, torch.randn(12, 8), backend="inductor")
