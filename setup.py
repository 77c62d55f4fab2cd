"""tasks/ sits at the top of the repository (one folder per dataset) and installs as longdoc.tasks,
so that adding a dataset means adding a folder and nothing else.

The folders that hold only data (each task's configs/, the page of `longdoc serve`) are listed as
packages too, found as namespace packages: setuptools warns that a folder Python can import but
`packages` leaves out may stop being installed, and lists its files only through its own entry."""
from setuptools import find_namespace_packages, setup

NOT_CODE = ["__pycache__", "*.__pycache__"]
task_folders = find_namespace_packages("tasks", exclude=NOT_CODE)
task_names = [folder for folder in task_folders if "." not in folder]
setup(
    packages=find_namespace_packages(include=["longdoc", "longdoc.*"], exclude=NOT_CODE)
    + ["longdoc.tasks"] + [f"longdoc.tasks.{folder}" for folder in task_folders],
    package_dir={"longdoc": "longdoc", "longdoc.tasks": "tasks"},
    package_data={
        # Each task's published figures and shipped hyperparameters (configs/NAME.json, with a README
        # of their sources).
        **{f"longdoc.tasks.{name}": ["published.json"] for name in task_names},
        **{f"longdoc.tasks.{name}.configs": ["*.json", "*.md"] for name in task_names},
        # the attention's C++ kernel sources, compiled on first use (longdoc/model/kernels/cpu)
        "longdoc.model.kernels.cpu": ["*.cpp", "*.h"],
        # the page of `longdoc serve` (plain HTML, CSS and JavaScript)
        "longdoc.serve.static": ["*"],
    },
)
