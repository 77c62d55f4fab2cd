"""WikiHop (QAngaroo v1.1). Published figures: published.json."""

from longdoc.data.windows import QuestionLengthOption
from longdoc.data.task import Task

# An example reads its first window only (features.py): of the window options, the question's length.
TASK = Task.in_package(__name__, model_class="WikiHopModel", headline_metric="accuracy",
                       description="choose the answer among candidates, reading many supporting documents",
                       options=QuestionLengthOption)
