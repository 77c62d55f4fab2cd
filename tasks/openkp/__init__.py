"""OpenKP (MS MARCO keyphrase extraction). Published figures: published.json."""

from longdoc.options import Option
from longdoc.task import Task

TASK = Task.in_package(__name__, model_class="OpenKPModel", headline_metric="F1@3",
                       description="keyphrases of a web page, with its visual DOM",
                       train_options=(Option("stride", int, 128, "overlap in wordpieces between windows of a page "
                                                                 "longer than long_max_len"),))
