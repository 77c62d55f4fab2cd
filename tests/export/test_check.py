"""The export's check refuses a graph whose outputs differ from the model's, saying which output,
length and global count, and how much."""

import pytest
import torch

from longdoc import GlobalLocalModel
from longdoc.export.check import ExportMismatch, compare
from longdoc.export.graph import export_onnx
from longdoc.export.signature import signature_of
from tests.model.conftest import tiny_config


@pytest.mark.slow
def test_a_graph_of_other_weights_is_refused_at_the_first_length_with_the_difference():
    import onnxruntime

    torch.manual_seed(0)
    model = GlobalLocalModel(tiny_config()).eval()
    signature = signature_of(model)
    session = onnxruntime.InferenceSession(export_onnx(model, signature).SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    assert compare(model, session, signature)  # the graph of these weights passes
    with torch.no_grad():  # (random: a uniform shift would vanish in the next LayerNorm)
        model.embeddings.word_embeddings.weight.add_(torch.randn_like(model.embeddings.word_embeddings.weight) * 0.01)
    with pytest.raises(ExportMismatch, match=r"long_hidden_state differs from PyTorch's by [0-9.e-]+ at 3 long tokens "
                                             r"and 5 global tokens \(allowed 0.0001\); nothing was written"):
        compare(model, session, signature)
