"""tasks/ sits at the top of the repository (one folder per dataset) and installs as longdoc.tasks,
so that adding a dataset means adding a folder and nothing else."""
from setuptools import find_packages, setup

task_packages = ["longdoc.tasks"] + [f"longdoc.tasks.{name}" for name in find_packages("tasks")]
setup(
    packages=find_packages(include=["longdoc", "longdoc.*"]) + task_packages,
    package_dir={"longdoc": "longdoc", "longdoc.tasks": "tasks"},
    # Each task's shipped hyperparameters (configs/NAME.json, with a README of their sources).
    package_data={
        **{f"longdoc.tasks.{name}": ["configs/*.json", "configs/*.md", "published.json"]
           for name in find_packages("tasks")},
        # the attention's C++ kernel sources, compiled on first use (longdoc/model/kernels/cpu)
        "longdoc.model.kernels.cpu": ["*.cpp", "*.h"],
        # the page of `longdoc serve` (plain HTML, CSS and JavaScript)
        "longdoc.serve": ["static/*"],
    },
)
