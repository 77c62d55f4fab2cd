"""WikiHop (QAngaroo v1.1). Published figures: published.json."""

from longdoc.options import Option
from longdoc.task import Task

TASK = Task.in_package(__name__, model_class="WikiHopModel", headline_metric="accuracy",
                       description="choose the answer among candidates, reading many supporting documents",
                       train_options=(Option("max_question_len", int, 64, "query wordpieces kept"),))
