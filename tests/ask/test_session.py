"""An `ask` session finds its reader through the model folder's task: a task of one's own whose model
answers with spans reads passages with no line in longdoc/ask (its Task record names an `ask` part);
a trained model of a task without one, or of a task the registry does not hold, is refused."""

import pytest

from longdoc.ask.documents import load_sources
from longdoc.ask.session import AskSession
from longdoc.errors import InputError
from longdoc.model_folder import read_model_folder
from longdoc.data.task import Task, TaskRegistry
from longdoc.tasks.hotpotqa.model import HotpotQAModel
from longdoc.tasks.wikihop.model import WikiHopModel
from tests.tasks.conftest import TINY_ENCODER, span_answering_model, write_encoder


class SpanlikeModel(HotpotQAModel):
    """Another task's model with HotpotQA's heads, saved under its own task name."""

    task_name = "spanlike"


SPANLIKE = Task(name="spanlike", description="a task of one's own", headline_metric="f1",
                model=f"{__name__}:SpanlikeModel", ask="longdoc.tasks.hotpotqa.ask")


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("session")
    write_encoder(root / "encoder", tokenizer, **TINY_ENCODER, long_max_len=256, global_max_len=64)
    span_answering_model(root / "spanlike", root / "encoder", tokenizer, SpanlikeModel, max_question_len=32)
    WikiHopModel.from_encoder(root / "encoder", max_question_len=32).save_pretrained(root / "wikihop")
    tokenizer.save_pretrained(root / "wikihop")
    (root / "notes.txt").write_text("Ada Quell works for Orbix Group.\n\nOrbix Group is based in Tallinnford.\n")
    return root


def _sources(folders):
    sources, errors = load_sources([str(folders / "notes.txt")])
    assert not errors
    return sources


@pytest.mark.slow
def test_a_task_of_ones_own_with_an_ask_part_reads_spans(folders):
    tasks = TaskRegistry()
    tasks.register(SPANLIKE)
    session = AskSession(_sources(folders), read_model_folder(folders / "spanlike"), progress=False,
                         cache_root=folders / "index", tasks=tasks)
    result = session.ask("Where is Orbix Group based?", top_k=3, min_score=0.0, min_evidence=-1)
    assert result["mode"] == "span" and type(session.model) is SpanlikeModel
    text = (folders / "notes.txt").read_text()
    assert result["answers"]
    for answer in result["answers"]:
        assert answer["text"] == text[answer["start"]:answer["end"]] and answer["support"]


def test_a_model_of_a_task_without_an_ask_part_or_unknown_is_refused(folders):
    tasks = TaskRegistry()
    tasks.register(Task(name="wikihop", description="candidates", headline_metric="accuracy",
                        model="longdoc.tasks.wikihop.model:WikiHopModel"))
    with pytest.raises(InputError, match="the wikihop task does not read passages for ask"):
        AskSession(_sources(folders), read_model_folder(folders / "wikihop"), progress=False, tasks=tasks)
    with pytest.raises(InputError, match="holds a trained 'spanlike' model, a task this program does not know"):
        AskSession(_sources(folders), read_model_folder(folders / "spanlike"), progress=False, tasks=tasks)
