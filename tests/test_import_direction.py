"""The library and the tasks point one way: the library (longdoc/, less the command line) imports no
task package and not the command line; a task imports the library and its own package, never
another task, the registry or the command line; the registry (tasks/__init__.py) imports the tasks.
The command line (longdoc/cli.py, longdoc/commands/) is where the registry is handed to the library.

Module names are the installed ones (setup.py installs tasks/ as longdoc.tasks), read from the source
(ast) wherever the import statement is, so nothing is imported to check (tests/model's checker)."""

from pathlib import Path

import pytest

import longdoc
from tests.model.test_import_direction import longdoc_imports

LIBRARY_ROOT = Path(longdoc.__file__).parent
TASKS_ROOT = LIBRARY_ROOT.parent / "tasks"
COMMAND_LINE = ("longdoc.cli", "longdoc.commands")
TASKS = "longdoc.tasks"


def module_name(path: Path, tasks_root: Path = TASKS_ROOT) -> str:
    """The installed name of a source file: longdoc/ask/reader.py -> longdoc.ask.reader,
    tasks/nq/decode.py -> longdoc.tasks.nq.decode, tasks/__init__.py -> longdoc.tasks."""
    if path.is_relative_to(tasks_root):
        parts = ("longdoc", "tasks", *path.relative_to(tasks_root).with_suffix("").parts)
    else:
        parts = ("longdoc", *path.relative_to(LIBRARY_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def within(name: str, *prefixes: str) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def library_modules() -> list[Path]:
    return [path for path in sorted(LIBRARY_ROOT.rglob("*.py")) if not within(module_name(path), *COMMAND_LINE)]


def task_modules() -> list[Path]:
    return [path for path in sorted(TASKS_ROOT.rglob("*.py")) if path.parent != TASKS_ROOT]


def library_import_allowed(module: str, name: str) -> bool:
    return not within(name, TASKS, *COMMAND_LINE)


def task_import_allowed(module: str, name: str) -> bool:
    own_package = ".".join(module.split(".")[:3])  # longdoc.tasks.NAME
    return within(name, own_package) or not within(name, TASKS, *COMMAND_LINE)


def wrong_imports(paths: list[Path], allowed, tasks_root: Path = TASKS_ROOT) -> list[str]:
    return sorted(f"{module_name(path, tasks_root)}: {name}" for path in paths for name in longdoc_imports(path)
                  if not allowed(module_name(path, tasks_root), name))


def test_installed_names_and_the_modules_found():
    assert module_name(LIBRARY_ROOT / "ask" / "reader.py") == "longdoc.ask.reader"
    assert module_name(TASKS_ROOT / "nq" / "decode.py") == "longdoc.tasks.nq.decode"
    assert module_name(TASKS_ROOT / "__init__.py") == "longdoc.tasks"
    assert {module_name(path).split(".")[2] for path in task_modules()} >= {"hotpotqa", "multihop", "nq", "openkp",
                                                                           "wikihop"}
    assert len(library_modules()) > 60


def test_the_library_imports_no_task_and_not_the_command_line():
    found = wrong_imports(library_modules(), library_import_allowed)
    assert not found, "the library imports a task or the command line:\n" + "\n".join(found)


def test_a_task_imports_the_library_and_its_own_package_only():
    found = wrong_imports(task_modules(), task_import_allowed)
    assert not found, "a task imports another task, the registry or the command line:\n" + "\n".join(found)


@pytest.mark.parametrize("source, expected", [
    ("from longdoc.tasks.nq.features import collate\n", ["longdoc.tasks.openkp.decode: longdoc.tasks.nq.features"]),
    ("from longdoc.tasks import REGISTRY\n", ["longdoc.tasks.openkp.decode: longdoc.tasks"]),
    ("from longdoc.tasks.openkp.features import collate\nfrom longdoc.data.features import Features\n", []),
    ("from longdoc.commands.hints import with_hint\n", ["longdoc.tasks.openkp.decode: longdoc.commands.hints"]),
])
def test_the_task_rule_sees_another_task_and_the_registry(tmp_path, source, expected):
    folder = tmp_path / "tasks" / "openkp"
    folder.mkdir(parents=True)
    (folder / "decode.py").write_text(source)
    assert wrong_imports([folder / "decode.py"], task_import_allowed, tmp_path / "tasks") == expected


def import_cycle(imports: dict[str, set[str]]) -> list[str]:
    """One chain of modules that leads back to its first (each importing the next), or [] when there is none."""
    state: dict[str, str] = {}  # module -> "open" while on the current path, "done" once all below it is seen

    def visit(module: str, path: list[str]) -> list[str]:
        state[module] = "open"
        for name in sorted(imports.get(module, ())):
            if state.get(name) == "open":
                return path[path.index(name):] + [module, name] if name in path else [module, name]
            if name not in state:
                found = visit(name, path + [module])
                if found:
                    return found
        state[module] = "done"
        return []

    for module in sorted(imports):
        found = [] if module in state else visit(module, [])
        if found:
            return found
    return []


def test_the_library_has_no_import_cycle():
    # Function-level imports included (longdoc_imports reads every import statement): a cycle hidden in
    # a function still ties its modules together. A package and its own submodules are left out:
    # `from package import sibling` names the package whose __init__ gathers the siblings.
    imports = {module_name(path): longdoc_imports(path) for path in library_modules()}
    graph = {module: {name for name in names if name in imports and not within(name, module)
                      and not within(module, name)} for module, names in imports.items()}
    cycle = import_cycle(graph)
    assert not cycle, "modules that import each other: " + " -> ".join(cycle)
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
