"""longdoc: question answering over long documents with an ETC-style global-local encoder.

Importing longdoc registers its encoder with transformers' Auto classes (longdoc.model.auto_classes), its
one effect beyond defining names, so that a saved longdoc folder loads as other checkpoints do:

    import longdoc, transformers
    # the GlobalLocalModel encoder of the task model `longdoc train hotpotqa ... --out runs/hp` saved
    model = transformers.AutoModel.from_pretrained("runs/hp")
"""

from longdoc.model.auto_classes import register_auto_classes

__all__ = ["GlobalLocalConfig", "GlobalLocalModel", "GlobalLocalModelOutput"]

register_auto_classes()


def __getattr__(name: str):
    # Imported on first use, so that `longdoc --help` and the metric commands do not load torch.
    if name == "GlobalLocalConfig":
        from longdoc.model.config import GlobalLocalConfig

        return GlobalLocalConfig
    if name in ("GlobalLocalModel", "GlobalLocalModelOutput"):
        from longdoc.model import modeling

        return getattr(modeling, name)
    raise AttributeError(f"module 'longdoc' has no attribute {name!r}")
