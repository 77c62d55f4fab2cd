"""OpenKP (MS MARCO keyphrase extraction). Published figures: published.json."""

from longdoc.data.windows import StrideOption
from longdoc.data.task import Task

# A page has no question: of the window options, the stride.
TASK = Task.in_package(__name__, model_class="OpenKPModel", headline_metric="F1@3",
                       description="keyphrases of a web page, with its visual DOM", options=StrideOption)
