"""The export's check refuses a graph whose outputs differ from the model's, saying which output,
length and global count, and how much."""

import copy

import pytest
import torch

from longdoc.export.check import ExportMismatch, compare


@pytest.mark.slow
def test_a_graph_of_other_weights_is_refused_at_the_first_length_with_the_difference(exported_variant):
    model, signature, session = exported_variant("etc")
    assert compare(model, session, signature)  # the graph of these weights passes
    other = copy.deepcopy(model)  # (the shared model's weights stay those of its graph)
    with torch.no_grad():  # (random: a uniform shift would vanish in the next LayerNorm)
        other.embeddings.word_embeddings.weight.add_(torch.randn_like(other.embeddings.word_embeddings.weight) * 0.01)
    with pytest.raises(ExportMismatch, match=r"long_hidden_state differs from PyTorch's by [0-9.e-]+ at 3 long tokens "
                                             r"and 5 global tokens \(allowed 0.0001\); nothing was written"):
        compare(other, session, signature)
