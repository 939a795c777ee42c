"""attnlab inside Hugging Face models: parity with transformers' own sdpa, masks, weights, errors."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnlab.integrations import hf  # noqa: E402

BACKENDS = ["auto", "math", "sdpa", "chunked", "reference"]
TOL = 1e-5  # fp32, against transformers' sdpa


def _configs():
    from transformers import BertConfig, GPT2Config, LlamaConfig, MistralConfig

    return {
        "bert": BertConfig(vocab_size=64, hidden_size=36, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=40, max_position_embeddings=64),
        "gpt2": GPT2Config(vocab_size=64, n_embd=36, n_layer=2, n_head=4, n_positions=64, bos_token_id=0,
                           eos_token_id=0),
        # grouped-query heads (9 query heads over 3 key/value heads), head dim 4
        "llama": LlamaConfig(vocab_size=64, hidden_size=36, intermediate_size=40, num_hidden_layers=2,
                             num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=64),
        # the config asks for a sliding window of 4 keys, shorter than the 11-token inputs
        "mistral": MistralConfig(vocab_size=64, hidden_size=40, intermediate_size=40, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                 sliding_window=4),
    }


# every test of this file runs on one xdist worker (scripts/test.sh: --dist loadgroup), which builds its fixture once
pytestmark = pytest.mark.xdist_group("test_hf")


@pytest.fixture(scope="session")  # once per worker: a module fixture is rebuilt when the queue moves away and back
def folders(tmp_path_factory):
    """Randomly initialised models saved as Hugging Face folders (no download)."""
    from transformers import AutoModel

    out = {}
    for name, cfg in _configs().items():
        torch.manual_seed(0)
        d = tmp_path_factory.mktemp(name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            AutoModel.from_config(cfg).save_pretrained(d)
        out[name] = d
    return out


def _batch():
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 64, (3, 11), generator=gen)  # (3, 11)
    keep = torch.ones(3, 11, dtype=torch.long)
    keep[1, 7:] = 0  # right-padded rows
    keep[2, 2:] = 0
    return ids, keep


def _load(path, impl):
    from transformers import AutoModel

    return AutoModel.from_pretrained(str(path), attn_implementation=impl).eval()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "mistral"])
@torch.no_grad()
def test_equals_transformers_sdpa_with_padding(folders, name, backend):
    ids, keep = _batch()
    ref = _load(folders[name], "sdpa")
    model = hf.from_pretrained(folders[name], backend=backend)
    assert model.config._attn_implementation == ("attnlab" if backend == "auto" else f"attnlab_{backend}")
    for mask in (keep, None):  # padded batch, then the unpadded (causal-only) call
        want = ref(input_ids=ids, attention_mask=mask).last_hidden_state
        got = model(input_ids=ids, attention_mask=mask).last_hidden_state
        real = (keep if mask is not None else torch.ones_like(keep)).bool()
        torch.testing.assert_close(got[real], want[real], atol=TOL, rtol=0)


@pytest.mark.parametrize("name", ["gpt2", "llama", "mistral"])
@torch.no_grad()
def test_causal_masking_reaches_attnlab(folders, name):
    """Changing later tokens must not move earlier outputs (the mask function is registered too)."""
    ids, _ = _batch()
    model = hf.from_pretrained(folders[name])
    other = ids.clone()
    other[:, 6:] = (other[:, 6:] + 7) % 64
    a = model(input_ids=ids).last_hidden_state
    b = model(input_ids=other).last_hidden_state
    torch.testing.assert_close(a[:, :6], b[:, :6], atol=1e-6, rtol=0)
    assert (a[:, 6:] - b[:, 6:]).abs().max() > 1e-3


@torch.no_grad()
def test_sliding_window_from_the_config_is_applied(folders):
    """With Mistral's window of 4, the last token does not see the first: changing it moves nothing there."""
    ids, _ = _batch()
    model = hf.from_pretrained(folders["mistral"])
    other = ids.clone()
    other[:, 0] = (other[:, 0] + 5) % 64
    a, b = model(input_ids=ids).last_hidden_state, model(input_ids=other).last_hidden_state
    # 2 layers of a 4-key window reach back 6 positions: position 10 cannot see position 0
    torch.testing.assert_close(a[:, 10], b[:, 10], atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
@torch.no_grad()
def test_weights_equal_eager_ones(folders, name):
    ids, keep = _batch()
    want = _load(folders[name], "eager")(input_ids=ids, attention_mask=keep, output_attentions=True).attentions
    got = hf.from_pretrained(folders[name])(input_ids=ids, attention_mask=keep, output_attentions=True).attentions
    assert len(got) == len(want) == 2
    for g, w in zip(got, want):
        rows = keep.bool()[:, None, :, None].expand_as(w)  # padded query rows differ by convention
        torch.testing.assert_close(g[rows], w[rows], atol=TOL, rtol=0)


def test_a_model_outside_the_interface_is_refused(tmp_path):
    from transformers import BloomConfig, BloomModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        BloomModel(BloomConfig(vocab_size=32, hidden_size=16, n_layer=1, n_head=2)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"BloomModel \(model_type 'bloom'\) does not route .*tested: bert, gpt2"):
        hf.from_pretrained(tmp_path)


def test_register_validates_and_names_both_registries():
    from transformers import AttentionInterface, AttentionMaskInterface

    with pytest.raises(ValueError, match="backend must be one of"):
        hf.register("nope")
    assert hf.register("math", "attnlab_test_math") == "attnlab_test_math"
    assert "attnlab_test_math" in AttentionInterface._global_mapping
    assert "attnlab_test_math" in AttentionMaskInterface._global_mapping


def test_missing_transformers_names_the_pip_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match=r"pip install 'transformers>=4\.40'"):
        hf.register()


def test_importing_attnlab_never_imports_the_optional_packages():
    code = ("import sys, attnlab, attnlab.integrations.hf, attnlab.deploy, attnlab.cli; attnlab.cli.build_parser(); "
            "bad = [m for m in ('transformers', 'onnx', 'onnxruntime', 'onnxscript', 'torchao') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert res.returncode == 0, res.stdout + res.stderr


@torch.no_grad()
def test_minilm_equals_transformers_sdpa():
    from attnlab.models.bert import minilm_path

    try:
        path = minilm_path()
    except ImportError:
        pytest.skip("the MiniLM weights package is not installed")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    enc = tok.encode_batch(["A man is playing a guitar.", "The weather is lovely today, isn't it?", "Hi"])
    ids = torch.tensor([e.ids for e in enc])
    keep = torch.tensor([e.attention_mask for e in enc])
    want = _load(path, "sdpa")(input_ids=ids, attention_mask=keep).last_hidden_state
    got = hf.from_pretrained(path)(input_ids=ids, attention_mask=keep).last_hidden_state
    torch.testing.assert_close(got[keep.bool()], want[keep.bool()], atol=TOL, rtol=0)
