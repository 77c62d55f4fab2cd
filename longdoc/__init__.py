"""longdoc: question answering over long documents with an ETC-style global-local encoder."""

from longdoc.config import GlobalLocalConfig
from longdoc.modeling import GlobalLocalModel, GlobalLocalModelOutput

__all__ = ["GlobalLocalConfig", "GlobalLocalModel", "GlobalLocalModelOutput"]
