"""longdoc's encoder registered with transformers' Auto classes, as `import longdoc` does: the config
with AutoConfig, the encoder with AutoModel, the span reader (longdoc.model.span_reader) with
AutoModelForQuestionAnswering.

AutoConfig and AutoModel know only the classes registered with them, and registering needs the
classes: torch and transformers' model code, seconds to import, which `longdoc --help` and the
metric commands never load. So `register_auto_classes` registers at once with what transformers has
already imported, and leaves the rest to a finder on `sys.meta_path` that
registers right after the modules of `WATCHED` finish importing, then takes itself off the path.

transformers imports AutoModel part way through its own model code (modeling_layers imports it
before defining the layer class the encoder subclasses), so an attempt made as AutoModel's module
finishes can meet a half-imported module; it is dropped, and the next watched module to finish
(the half-imported one among them) tries again.
"""

import importlib.abc
import sys

CONFIG_AUTO = "transformers.models.auto.configuration_auto"
MODEL_AUTO = "transformers.models.auto.modeling_auto"
# The modules that define the Auto classes, and those the encoder's own imports can find
# half-imported when AutoModel's module finishes first.
WATCHED = frozenset({
    CONFIG_AUTO, MODEL_AUTO, "transformers.configuration_utils", "transformers.modeling_utils",
    "transformers.modeling_layers", "longdoc.model.config", "longdoc.model.modeling",
    "longdoc.model.encoder_folder", "longdoc.model.task_model", "longdoc.model.span_reader",
})


def _register_config() -> None:
    from transformers.models.auto.configuration_auto import AutoConfig

    from longdoc.model.config import GlobalLocalConfig

    AutoConfig.register(GlobalLocalConfig.model_type, GlobalLocalConfig, exist_ok=True)


def _register_model() -> None:
    from transformers.models.auto.modeling_auto import AutoModel

    from longdoc.model.modeling import GlobalLocalConfig, GlobalLocalModel

    AutoModel.register(GlobalLocalConfig, GlobalLocalModel, exist_ok=True)


def _register_span_reader() -> None:
    from transformers.models.auto.modeling_auto import AutoModelForQuestionAnswering

    from longdoc.model.config import GlobalLocalConfig
    from longdoc.model.span_reader import SpanReader

    AutoModelForQuestionAnswering.register(GlobalLocalConfig, SpanReader, exist_ok=True)


# Each registration and the module of transformers' it waits for.
REGISTRATIONS = ((CONFIG_AUTO, _register_config), (MODEL_AUTO, _register_model), (MODEL_AUTO, _register_span_reader))
_pending = set(REGISTRATIONS)  # the registrations not done yet
_registering = False


def _register_imported() -> None:
    """Each registration whose Auto class transformers has imported; the finder goes once all are done."""
    global _registering
    if _registering:  # the registration's own imports finishing
        return
    _registering = True
    try:
        for registration in REGISTRATIONS:
            name, register = registration
            if registration not in _pending or name not in sys.modules:
                continue
            try:
                register()
            except ImportError:
                continue  # a half-imported module (see the module docstring): the next watched one tries again
            _pending.discard(registration)
    finally:
        _registering = False
    if not _pending and _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)


class _RegisterAfter(importlib.abc.Loader):
    """The module's own loader, then the registration."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        _register_imported()

    def __getattr__(self, name):  # get_source, get_filename, ...: the module's own loader's
        return getattr(self._loader, name)


class _WatchedImports(importlib.abc.MetaPathFinder):
    """Finds a watched module as the other finders do, with its loader wrapped in _RegisterAfter."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in WATCHED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _RegisterAfter(spec.loader)
                return spec
        return None


_FINDER = _WatchedImports()


def register_auto_classes() -> None:
    """Register GlobalLocalConfig with AutoConfig, GlobalLocalModel with AutoModel and SpanReader with
    AutoModelForQuestionAnswering: now where transformers has imported them, else as soon as it does."""
    _register_imported()
    if _pending and _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
