"""Weight init schemes (``attnlab.models.init``): each changes what it should and nothing else,
``embed_std`` redraws the embeddings after any scheme, and bad arguments fail naming themselves."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnlab.models import CausalLM, CausalLMConfig
from attnlab.models.init import INIT_SCHEMES, init_weights
from attnlab.train.config import INITS

LAYERS = 3


def _model() -> CausalLM:
    torch.manual_seed(0)
    return CausalLM(CausalLMConfig(vocab_size=97, dim=40, heads=5, layers=LAYERS, tie_embeddings=False,
                                   positional="learned", max_len=33))


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _kinds(model: nn.Module) -> dict[str, str]:
    """Parameter name -> ``linear.weight``, ``linear.bias``, ``embedding`` or ``other`` (norms, learned positions)."""
    kinds = {}
    for mname, m in model.named_modules():
        for pname, _ in m.named_parameters(recurse=False):
            name = f"{mname}.{pname}" if mname else pname
            if isinstance(m, nn.Linear):
                kinds[name] = f"linear.{pname}"
            elif isinstance(m, nn.Embedding):
                kinds[name] = "embedding"
            else:
                kinds[name] = "other"
    return kinds


@pytest.mark.parametrize("scheme", list(INIT_SCHEMES))
def test_every_scheme_is_seeded_and_leaves_norms_and_positions_alone(scheme):
    before = _params(model := _model())
    torch.manual_seed(1)
    init_weights(model, scheme)
    again = _model()
    torch.manual_seed(1)
    init_weights(again, scheme)
    after, repeat = _params(model), _params(again)
    for name, kind in _kinds(model).items():
        torch.testing.assert_close(after[name], repeat[name], rtol=0, atol=0)  # same seed, same weights
        if kind == "other":  # LayerNorm gains and biases, the learned positional table
            torch.testing.assert_close(after[name], before[name], rtol=0, atol=0)


@pytest.mark.parametrize("scheme", list(INIT_SCHEMES))
def test_embed_std_redraws_every_embedding_after_any_scheme(scheme):
    torch.manual_seed(1)
    init_weights(plain := _model(), scheme)
    torch.manual_seed(1)
    init_weights(model := _model(), scheme, embed_std=1.5)
    kinds, plain_params = _kinds(model), _params(plain)
    for name, p in _params(model).items():
        if kinds[name] == "embedding":
            assert p.std().item() == pytest.approx(1.5, rel=0.05) and abs(p.mean().item()) < 0.05
        else:  # drawn before the embeddings, so unchanged by them
            torch.testing.assert_close(p, plain_params[name], rtol=0, atol=0)


def test_default_keeps_the_constructors_weights():
    before = _params(model := _model())
    init_weights(model, "default")
    for name, p in _params(model).items():
        torch.testing.assert_close(p, before[name], rtol=0, atol=0)


def test_xavier_redraws_linear_weights_glorot_uniform_and_zeroes_their_biases():
    before = _params(model := _model())
    init_weights(model, "xavier")
    kinds = _kinds(model)
    for name, p in _params(model).items():
        if kinds[name] == "linear.weight":
            fan_out, fan_in = p.shape
            bound = math.sqrt(6 / (fan_in + fan_out))
            assert not torch.equal(p, before[name]) and p.abs().max() <= bound
            assert p.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.1)  # U(-a, a) has std a / sqrt(3)
        elif kinds[name] == "linear.bias":
            assert torch.count_nonzero(p) == 0
        else:  # embeddings keep the constructor's init
            torch.testing.assert_close(p, before[name], rtol=0, atol=0)


def test_gpt2_draws_linear_and_embedding_weights_at_002_and_scales_residual_projections():
    before = _params(model := _model())
    init_weights(model, "gpt2")
    kinds = _kinds(model)
    residual = 0.02 / math.sqrt(2 * LAYERS)
    seen = set()
    for name, p in _params(model).items():
        if kinds[name] in ("linear.weight", "embedding"):
            std = residual if name.endswith(("out_proj.weight", "fc2.weight")) else 0.02
            assert p.std().item() == pytest.approx(std, rel=0.1), name
            seen.add(std)
        elif kinds[name] == "linear.bias":
            assert torch.count_nonzero(p) == 0
        else:
            torch.testing.assert_close(p, before[name], rtol=0, atol=0)
    assert seen == {0.02, residual}


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match=r"scheme must be one of \['default', 'xavier', 'gpt2'\], got 'he'"):
        init_weights(_model(), "he")
    with pytest.raises(ValueError, match=r"embed_std must be >= 0.*got -1.0"):
        init_weights(_model(), "default", embed_std=-1.0)


def test_train_config_takes_exactly_the_schemes():
    assert INITS == tuple(INIT_SCHEMES)
