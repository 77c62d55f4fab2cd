"""Export: a longdoc model as an ONNX graph that gives the model's answers at every length, and that
graph served by ONNX Runtime in the place of the PyTorch model.

- signature: what a graph takes and gives (the input schema's specs, a task's prediction inputs,
  the outputs), sample batches, the neutral value of an absent input;
- graph: the export through torch's own exporter (torch.export, every axis dynamic), opsets;
- check: the graph against the PyTorch model at lengths it was not traced at, before anything is written;
- folder: `longdoc export`'s folder (the graph, the model, the tokenizer, export.json and a card);
- runtime: `OnnxModel`, what the decoders read where they read a task model (`--runtime onnx`).

Needs the `onnx` extra (onnx, onnxruntime, onnxscript): `pip install "longdoc[onnx]"`.
"""
