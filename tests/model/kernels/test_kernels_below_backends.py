"""The kernels sit below the backends: a backend calls its kernels (longdoc.model.backends.cpu and
.gpu hold the autograd functions around them), and no kernel module imports a backend, so the two
layers form no import cycle."""

from tests.model.test_import_direction import PACKAGE, longdoc_imports

KERNELS = PACKAGE / "model" / "kernels"


def test_no_kernel_module_imports_a_backend():
    modules = sorted(KERNELS.rglob("*.py"))
    assert len(modules) >= 7, modules
    upward = {f"{path.relative_to(PACKAGE.parent)}: {name}" for path in modules for name in longdoc_imports(path)
              if name == "longdoc.model.backends" or name.startswith("longdoc.model.backends.")}
    assert not upward, "kernel modules import the backends:\n" + "\n".join(sorted(upward))
