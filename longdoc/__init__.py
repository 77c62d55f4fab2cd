"""longdoc: question answering over long documents with an ETC-style global-local encoder."""

__all__ = ["GlobalLocalConfig", "GlobalLocalModel", "GlobalLocalModelOutput"]


def __getattr__(name: str):
    # Imported on first use, so that `longdoc --help` and the metric commands do not load torch.
    if name == "GlobalLocalConfig":
        from longdoc.model.config import GlobalLocalConfig

        return GlobalLocalConfig
    if name in ("GlobalLocalModel", "GlobalLocalModelOutput"):
        from longdoc.model import modeling

        return getattr(modeling, name)
    raise AttributeError(f"module 'longdoc' has no attribute {name!r}")
