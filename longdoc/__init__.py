"""longdoc: question answering over long documents with an ETC-style global-local encoder.

The model classes register themselves with transformers' Auto classes where they are defined, as
transformers documents for custom models (`AutoConfig.register`, `AutoModel.register`), so a saved
longdoc folder loads as other checkpoints do once they are imported; `import longdoc` alone imports
neither torch nor transformers and changes nothing in them:

    import transformers
    from longdoc import GlobalLocalModel  # registers the config and the encoder
    # the GlobalLocalModel encoder of the task model `longdoc train hotpotqa ... --out runs/hp` saved
    model = transformers.AutoModel.from_pretrained("runs/hp")
"""

__all__ = ["GlobalLocalConfig", "GlobalLocalModel", "GlobalLocalModelOutput", "SpanReader"]


def __getattr__(name: str):
    # Imported on first use, so that `longdoc --help` and the metric commands do not load torch.
    if name == "GlobalLocalConfig":
        from longdoc.model.config import GlobalLocalConfig

        return GlobalLocalConfig
    if name == "GlobalLocalModel":
        from longdoc.model.pretrained import GlobalLocalModel

        return GlobalLocalModel
    if name == "GlobalLocalModelOutput":
        from longdoc.model.modeling import GlobalLocalModelOutput

        return GlobalLocalModelOutput
    if name == "SpanReader":
        from longdoc.model.span_reader import SpanReader

        return SpanReader
    raise AttributeError(f"module 'longdoc' has no attribute {name!r}")
