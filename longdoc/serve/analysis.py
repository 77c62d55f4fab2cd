"""`longdoc serve --analysis DIR`: the folder `longdoc analyze attention` wrote, for the page to show.

Only analysis.json and the plots it lists are served, by those names: nothing else in the folder or
on the machine can be reached."""

from pathlib import Path

from longdoc.analyze import ANALYSIS_FILE
from longdoc.errors import InputError
from longdoc.io import read_json


class AnalysisFolder:
    """An analysis folder, read once: its figures and the plot files it lists."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        path = self.folder / ANALYSIS_FILE
        if not path.is_file():
            raise InputError(f"--analysis {folder}: no {ANALYSIS_FILE} (the --out of `longdoc analyze attention`)")
        analysis = read_json(path)
        if not isinstance(analysis, dict) or not {"model", "data", "statistics"} <= set(analysis):
            raise InputError(f"{path}: not an analysis of `longdoc analyze attention` (no model, data and statistics)")
        self.analysis = analysis
        self.plots = {name: self.folder / name for name in analysis.get("plots", [])
                      if isinstance(name, str) and "/" not in name and (self.folder / name).is_file()}

    def info(self) -> dict:
        return {"mode": "analysis", "folder": str(self.folder), "model": self.analysis["model"],
                "data": self.analysis["data"], "plots": list(self.plots)}

    def plot(self, name: str) -> Path | None:
        """The file of plot `name`, if analysis.json lists it."""
        return self.plots.get(name)
