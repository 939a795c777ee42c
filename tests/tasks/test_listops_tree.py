"""ListOps with the bracket-tree mask: the mask the task hands the model, and what it hides."""

from __future__ import annotations

import torch

from attnlab import masks
from attnlab.models import ClassifierConfig, SequenceClassifier
from attnlab.tasks import create_task
from attnlab.tasks.listops import VOCAB

ID = {t: i for i, t in enumerate(VOCAB)}


def test_tree_mask_option_hands_the_bracket_tree_to_the_model():
    opts = {"train_size": 16, "val_size": 8, "test_size": 8, "min_length": 10, "max_length": 40}
    flat = create_task("listops", **opts)
    tree = create_task("listops", tree_mask=True, **opts)
    batch = tree.train_batch(0, 4)
    assert flat.structure(batch["tokens"]) is None
    got = tree.structure(batch["tokens"])
    want = masks.brackets(batch["tokens"], opening=[ID[o] for o in ("[MIN", "[MAX", "[MED", "[SM")], closing=ID["]"])
    n = batch["tokens"].shape[1]
    torch.testing.assert_close(got.dense(n, n, batch=4), want.dense(n, n, batch=4))
    torch.manual_seed(0)
    model = SequenceClassifier(ClassifierConfig(vocab_size=len(VOCAB), num_classes=10, dim=16, heads=2, layers=1))
    loss, _ = tree.loss(model, batch)
    loss.backward()
    assert torch.isfinite(loss)
    assert 0.0 <= tree.evaluate(model, "val")["accuracy"] <= 1.0


def test_under_the_tree_mask_a_token_does_not_see_a_sibling_subtree():
    text = "<cls> [MAX 2 [MIN 4 7 ] [SM 1 3 ] ] <pad>".split()
    tokens = torch.tensor([[ID[t] for t in text]])
    keep = tokens != 0
    tree = masks.brackets(tokens, opening=[ID[o] for o in ("[MIN", "[MAX", "[MED", "[SM")], closing=ID["]"])
    torch.manual_seed(0)
    model = SequenceClassifier(ClassifierConfig(vocab_size=len(VOCAB), num_classes=10, dim=16, heads=2,
                                                layers=1)).eval()
    four = text.index("4")
    changed = tokens.clone()
    changed[0, text.index("1")] = ID["9"]  # a digit of the sibling subtree [SM 1 3 ]
    with torch.no_grad():
        a = model(tokens, keep, mask=tree).last_hidden_state
        b = model(changed, keep, mask=tree).last_hidden_state
        flat_a = model(tokens, keep).last_hidden_state
        flat_b = model(changed, keep).last_hidden_state
    torch.testing.assert_close(a[0, four], b[0, four])  # hidden from "4" by the tree
    assert not torch.allclose(flat_a[0, four], flat_b[0, four])  # seen without it
    assert not torch.allclose(a[0, 0], b[0, 0])  # the class token sees every token
