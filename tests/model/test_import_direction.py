"""`longdoc.model` depends on nothing else in the package: the encoder, its kernels, the heads and
the task and pretraining models can be read, tested and reused without the data pipeline, the
converters, training, the commands or the tasks. The one exception is `longdoc.errors`, a leaf
module (it imports nothing from longdoc) that every layer raises its InputError from.

Imports are read from the source (ast), so a module-level, a function-level and a conditional
import all count, and nothing is imported to check."""

import ast
from pathlib import Path

import longdoc

PACKAGE = Path(longdoc.__file__).parent
ALLOWED = ("longdoc.model", "longdoc.errors")


def longdoc_imports(path: Path) -> set[str]:
    """The longdoc modules that the module at `path` imports, wherever the import statement is."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            # `from longdoc import data` imports the subpackage longdoc.data
            if node.module == "longdoc":
                found.update(f"longdoc.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            raise AssertionError(f"{path}: relative import; the package writes absolute ones")
    return {name for name in found if name == "longdoc" or name.startswith("longdoc.")}


def is_allowed(name: str) -> bool:
    return any(name == allowed or name.startswith(allowed + ".") for allowed in ALLOWED)


def test_the_checker_sees_every_kind_of_import(tmp_path):
    source = tmp_path / "module.py"
    source.write_text("import longdoc.data.text\nfrom longdoc.convert import checkpoint\n"
                      "def f():\n    from longdoc import train\n    import torch\n"
                      "if True:\n    from longdoc.model.config import GlobalLocalConfig\n")
    assert longdoc_imports(source) == {"longdoc.data.text", "longdoc.convert", "longdoc", "longdoc.train",
                                       "longdoc.model.config"}
    assert [name for name in sorted(longdoc_imports(source)) if not is_allowed(name)] == [
        "longdoc", "longdoc.convert", "longdoc.data.text", "longdoc.train"]


def test_errors_is_a_leaf():
    assert longdoc_imports(PACKAGE / "errors.py") == set()


def test_longdoc_model_imports_only_longdoc_model_and_errors():
    modules = sorted((PACKAGE / "model").rglob("*.py"))
    assert len(modules) >= 10, modules
    outside = {f"{path.relative_to(PACKAGE.parent)}: {name}"
               for path in modules for name in longdoc_imports(path) if not is_allowed(name)}
    assert not outside, "longdoc.model imports from the rest of the package:\n" + "\n".join(sorted(outside))
