"""`longdoc predict` and `longdoc ask` with --device/--dtype/--attention, --json and --quiet, through
`longdoc.cli.main`, with a tiny WikiHop model trained here: a device this machine lacks, an attention
backend that cannot run, or bfloat16 on a CPU without its instructions (predict, ask, serve, analyze),
is one line and exit 2; bfloat16 and float16, and the dense attention backend, predict the answers
float32 predicts; --json is one object on stdout; --quiet hides longdoc's progress bars.

The tests that run bfloat16 on the CPU run it on any CPU (`cpu_bfloat16`): where the commands would
refuse it they test its outputs all the same, slower."""

import json
import warnings
from pathlib import Path

import datasets
import pytest
import torch

from longdoc.cli import main
from longdoc.convert.pretrained import default_tokenizer
from longdoc.tasks.wikihop.model import WikiHopModel
from tests.conftest import new_cache
from tests.tasks.conftest import span_answering_model, write_encoder

TRAIN = "wikihop/wikihop_train.first22.json"
DEV = "wikihop/wikihop_dev.first28.json"
ENCODER = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, local_radius=16,
               global_max_len=128, long_max_len=256)
DEV_EXAMPLES = 16  # of the 28: bfloat16's products are emulated on an AVX2 CPU, many times slower than float32
SUMMARY_KEYS = {"predictions", "scores", "task", "examples", "windows", "seconds", "examples_per_second", "device", "dtype",
                "runtime"}
TQDM_BAR = "100%|"  # a finished tqdm bar


@pytest.fixture
def cpu_bfloat16(monkeypatch):
    """bfloat16 allowed on this CPU, as on one with bfloat16 instructions."""
    from longdoc.model import inference

    monkeypatch.setattr(inference, "cpu_bfloat16_refusal", lambda: None)


@pytest.fixture(scope="module")
def trained(shared_data, tmp_path_factory):
    """(model folder, dev file of DEV_EXAMPLES examples): WikiHop trained 40 steps on the train sample."""
    root = tmp_path_factory.mktemp("wikihop")
    encoder = write_encoder(root / "encoder", default_tokenizer(), **ENCODER)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # supports cut at 256 wordpieces (tests/tasks/wikihop/test_pipeline.py)
        assert main(["--quiet", "train", "wikihop", "--config", "cpu", "--train", str(shared_data / TRAIN),
                     "--out", str(root / "run"), "--init", str(encoder), "--long-max-len", "256",
                     "--global-max-len", "128", "--max-steps", "40", "--batch-size", "4", "--lr", "1e-3",
                     "--seed", "0"]) == 0
    dev = root / "dev.json"
    dev.write_text(json.dumps(json.loads((shared_data / DEV).read_text())[:DEV_EXAMPLES]))
    return root / "run", dev


@pytest.fixture(scope="module")
def untrained(shared_data, tmp_path_factory):
    """(model folder, dev file) as `trained`, its heads fresh: for the checks that run before the model does."""
    root = tmp_path_factory.mktemp("wikihop_untrained")
    tokenizer = default_tokenizer()
    write_encoder(root / "encoder", tokenizer, **ENCODER)
    torch.manual_seed(0)
    WikiHopModel.from_encoder(root / "encoder").save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    dev = root / "dev.json"
    dev.write_text(json.dumps(json.loads((shared_data / DEV).read_text())[:DEV_EXAMPLES]))
    return root / "model", dev


def _predict(trained, out, *options):
    model, dev = trained
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return main(["--quiet", "predict", "wikihop", "--model", str(model), "--data", str(dev), "--out", str(out),
                     *options])


@pytest.mark.parametrize("device, message", [
    ("cuda:7", "longdoc predict: error: --device cuda:7: this machine has no CUDA device"),
    ("gpu0", "longdoc predict: error: --device gpu0: not a device name; use one of cpu, cuda, cuda:N, mps"),
])
def test_a_device_this_machine_lacks_exits_2_with_one_line(untrained, tmp_path, capsys, device, message):
    assert _predict(untrained, tmp_path / "pred.json", "--device", device) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "pred.json").exists()


def test_cuda_7_on_a_one_gpu_machine_names_the_device_it_has(untrained, tmp_path, capsys, monkeypatch):
    # The check comes before anything runs on the device, so a pretended GPU is never touched.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert _predict(untrained, tmp_path / "pred.json", "--device", "cuda:7") == 2
    assert capsys.readouterr().err == ("longdoc predict: error: --device cuda:7: this machine has 1 CUDA device "
                                       "(cuda:0)\n")


def test_a_model_whose_weights_are_on_meta_is_refused(untrained, tmp_path, capsys, monkeypatch):
    def load_nothing(cls, directory, *args, **kwargs):  # a loader that skipped the weights
        with torch.device("meta"):
            return cls(WikiHopModel.config_class.from_pretrained(directory))

    monkeypatch.setattr(WikiHopModel, "from_pretrained", classmethod(load_nothing))
    assert _predict(untrained, tmp_path / "pred.json") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"longdoc predict: error: {untrained[0]}: the model's weights were not loaded (")
    assert not (tmp_path / "pred.json").exists()


@pytest.mark.parametrize("options, message", [
    (("--attention", "gpu"), "--attention gpu: attention backend 'gpu' cannot run on cpu in float32: the GPU kernel "
                             "runs on CUDA tensors only; there "),
    (("--attention", "cpu", "--dtype", "float16"),
     "--attention cpu: attention backend 'cpu' cannot run on cpu in float16: the C++ kernels run on the CPU in "
     "float32, and in bfloat16 on float32 copies; there eager, dense can"),
])
def test_an_attention_backend_that_cannot_run_exits_2_with_one_line(untrained, tmp_path, capsys, options, message,
                                                                    without_triton_interpreter):
    assert _predict(untrained, tmp_path / "pred.json", "--device", "cpu", *options) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"longdoc predict: error: {message}") and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "pred.json").exists()


@pytest.mark.parametrize("command", ["predict", "ask", "serve", "analyze"])
def test_bfloat16_on_a_cpu_without_its_instructions_exits_2_with_one_line(untrained, tmp_path, capsys, monkeypatch,
                                                                          command):
    from longdoc.model import linear

    monkeypatch.setattr(linear, "bfloat16_instructions", lambda: False)
    model, dev = untrained
    document = tmp_path / "notes.txt"
    document.write_text("Orbix Group is based in Tallinnford.\n")
    arguments = {
        "predict": ["predict", "wikihop", "--model", str(model), "--data", str(dev), "--out", str(tmp_path / "p.json")],
        "ask": ["ask", "--question", "Where is Orbix Group based?", str(document)],
        "serve": ["serve", str(document), "--port", "0"],
        "analyze": ["analyze", "attention", "--model", str(model), "--data", str(dev), "--out", str(tmp_path / "a")],
    }[command]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["--quiet", *arguments, "--device", "cpu", "--bf16"]) == 2
    err = capsys.readouterr().err
    assert err == (f"longdoc {command}: error: --dtype bfloat16 (--bf16): this CPU has no bfloat16 instructions "
                   "(AVX512_BF16 or AMX), where bfloat16 runs slower than float32; use float32 (the default)\n")
    assert not (tmp_path / "p.json").exists() and not (tmp_path / "a").exists()


@pytest.mark.slow
def test_the_dense_attention_backend_predicts_the_answers_of_the_default(trained, tmp_path, monkeypatch):
    from longdoc.model.backends.dense import DenseBackend

    calls = []
    attend = DenseBackend.attend
    monkeypatch.setattr(DenseBackend, "attend", lambda self, operands: calls.append(1) or attend(self, operands))
    assert _predict(trained, tmp_path / "default.json", "--device", "cpu") == 0
    assert not calls
    assert _predict(trained, tmp_path / "dense.json", "--device", "cpu", "--attention", "dense") == 0
    assert calls  # the option reached the model
    assert json.loads((tmp_path / "dense.json").read_text()) == json.loads((tmp_path / "default.json").read_text())


@pytest.mark.slow  # the module's trained model: 40 training steps
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_lower_precisions_predict_the_answers_of_float32(trained, tmp_path, capsys, cpu_bfloat16, dtype):
    assert _predict(trained, tmp_path / "float32.json", "--device", "cpu") == 0
    assert _predict(trained, tmp_path / "lower.json", "--device", "cpu", "--dtype", dtype, "--json") == 0
    assert json.loads(capsys.readouterr().out)["dtype"] == dtype
    full = json.loads((tmp_path / "float32.json").read_text())
    lower = json.loads((tmp_path / "lower.json").read_text())
    assert set(lower) == set(full) and len(full) == DEV_EXAMPLES
    agree = sum(lower[key] == full[key] for key in full)
    # Measured: 16 of 16 in both precisions; a candidate whose logit is within rounding of the best may flip.
    assert agree >= DEV_EXAMPLES - 1, f"{dtype}: {agree} of {DEV_EXAMPLES} answers agree with float32"


@pytest.mark.slow  # the module's trained model: 40 training steps
def test_json_is_one_object_on_stdout_and_the_human_line_on_stderr(trained, tmp_path, capsys, cpu_bfloat16):
    assert _predict(trained, tmp_path / "pred.json", "--json", "--bf16", "--batch-size", "4") == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert set(summary) == SUMMARY_KEYS and captured.out.count("\n") == 1
    assert summary["predictions"] == str(tmp_path / "pred.json") and summary["task"] == "wikihop"
    assert summary["scores"] == str(tmp_path / "pred.json.scores.jsonl") and Path(summary["scores"]).is_file()
    assert summary["examples"] == DEV_EXAMPLES and summary["windows"] == DEV_EXAMPLES  # one window per WikiHop example
    assert summary["device"] == "cpu" and summary["dtype"] == "bfloat16" and summary["runtime"] == "torch"
    assert summary["seconds"] > 0 and summary["examples_per_second"] == pytest.approx(
        DEV_EXAMPLES / summary["seconds"], rel=1e-2)
    assert captured.err.startswith(f"wrote {tmp_path / 'pred.json'}: {DEV_EXAMPLES} examples ({DEV_EXAMPLES} windows)")


@pytest.mark.slow  # the module's trained model: 40 training steps
def test_quiet_hides_the_prediction_bar_that_is_shown_without_it(trained, tmp_path, capsys):
    model, dev = trained
    argv = ["predict", "wikihop", "--model", str(model), "--data", str(dev), "--out", str(tmp_path / "pred.json")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(argv) == 0
        shown = capsys.readouterr().err
        assert main(["--quiet", *argv]) == 0
        hidden = capsys.readouterr().err
    assert "predict:" in shown and TQDM_BAR in shown
    assert "predict:" not in hidden and TQDM_BAR not in hidden and hidden.startswith("wrote ")


def test_quiet_hides_the_training_bar(shared_data, tmp_path, capsys, monkeypatch):
    import itertools

    from longdoc.train import finetune

    runs = itertools.count()  # each run its own feature cache, so both read the training file
    monkeypatch.setattr(finetune, "feature_cache_folder", lambda: tmp_path / f"features-{next(runs)}")
    encoder = write_encoder(tmp_path / "encoder", default_tokenizer(), **ENCODER)
    argv = ["train", "wikihop", "--config", "cpu", "--train", str(shared_data / TRAIN), "--init", str(encoder),
            "--long-max-len", "256", "--global-max-len", "128", "--max-steps", "2", "--batch-size", "2"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main([*argv, "--out", str(tmp_path / "shown")]) == 0
        shown = capsys.readouterr().err
        assert main(["--quiet", *argv, "--out", str(tmp_path / "hidden")]) == 0
        hidden = capsys.readouterr().err
    assert "train wikihop:" in shown and TQDM_BAR in shown
    assert "train wikihop" not in hidden and TQDM_BAR not in hidden
    assert "features /" in shown and "features /" not in hidden  # reading the training file (its path)


def test_quiet_hides_the_bar_of_make_data(tmp_path, capsys):
    argv = ["make-data", "multihop", "--n", "2", "--length", "256", "--seed", "0"]
    assert main([*argv, "--out", str(tmp_path / "shown.json")]) == 0
    shown = capsys.readouterr().err
    assert main(["--quiet", *argv, "--out", str(tmp_path / "hidden.json")]) == 0
    hidden = capsys.readouterr().err
    assert "multihop examples:" in shown and TQDM_BAR in shown
    assert hidden == f"wrote 2 multihop examples to {tmp_path / 'hidden.json'}\n"
    # --quiet after the command, where users put flags, does the same
    assert main([*argv, "--out", str(tmp_path / "after.json"), "--quiet"]) == 0
    assert capsys.readouterr().err == f"wrote 2 multihop examples to {tmp_path / 'after.json'}\n"


def test_quiet_and_verbose_together_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["--quiet", "make-data", "multihop", "--n", "2", "--length", "256", "--seed", "0", "--out",
              str(tmp_path / "x.json"), "--verbose"])
    assert stopped.value.code == 2
    assert "argument --quiet: not allowed with argument --verbose" in capsys.readouterr().err


def test_quiet_hides_the_indexing_bar_of_ask(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LONGDOC_CACHE", str(new_cache(tmp_path / "cache")))  # nothing indexed yet, in either run
    document = tmp_path / "notes.txt"
    document.write_text("Ada Quell works for Orbix Group.\n\nOrbix Group is based in Tallinnford.\n")
    argv = ["ask", "--question", "Where is Orbix Group based?", str(document), "--device", "cpu"]
    assert main(argv) == 0
    shown = capsys.readouterr().err
    monkeypatch.setenv("LONGDOC_CACHE", str(new_cache(tmp_path / "cache-2")))
    assert main(["--quiet", *argv]) == 0
    hidden = capsys.readouterr().err
    assert "indexing:" in shown and TQDM_BAR in shown
    assert "indexing" not in hidden and TQDM_BAR not in hidden


def test_ask_runs_its_reader_in_the_dtype_asked_and_refuses_a_missing_device(tmp_path, capsys, monkeypatch,
                                                                            cpu_bfloat16):
    from longdoc.ask.documents import load_sources
    from longdoc.ask.session import AskSession, ReaderPlacement
    from longdoc.model.inference import resolve_placement
    from longdoc.model_folder import read_model_folder
    from longdoc.tasks import REGISTRY

    monkeypatch.setenv("LONGDOC_CACHE", str(new_cache(tmp_path / "cache")))
    tokenizer = default_tokenizer()
    write_encoder(tmp_path / "encoder", tokenizer, **ENCODER)
    span_answering_model(tmp_path / "reader", tmp_path / "encoder", tokenizer, stride=32, max_question_len=32)
    document = tmp_path / "notes.txt"
    document.write_text("Ada Quell works for Orbix Group.\n\nOrbix Group is based in Tallinnford.\n")

    sources, _ = load_sources([str(document)])
    session = AskSession(sources, read_model_folder(tmp_path / "reader"), progress=False,
                         placement=ReaderPlacement(*resolve_placement("cpu", "bfloat16")), tasks=REGISTRY)
    assert {parameter.dtype for parameter in session.model.parameters()} == {torch.bfloat16}
    assert session.embedder.model.dtype == torch.float32  # the retriever's vectors, as cached
    answers = session.ask("Where is Orbix Group based?", min_score=0.0, min_evidence=-1)["answers"]
    assert answers and all(document.read_text()[a["start"]:a["end"]] == a["text"] for a in answers)

    capsys.readouterr()  # (what saving the models printed: transformers' bars are on until a command turns them off)
    assert main(["ask", "--model", str(tmp_path / "reader"), "--question", "Where?", str(document),
                 "--device", "cuda:7"]) == 2
    assert capsys.readouterr().err.startswith("longdoc ask: error: --device cuda:7: this machine has no CUDA device")


@pytest.mark.slow  # the module's trained model: 40 training steps
def test_predict_reads_a_datasets_folder_as_the_official_file(trained, tmp_path):
    from tests.tasks.test_hub_exports import WIKIHOP_FEATURES, _wikihop_rows

    model, dev = trained
    folder = tmp_path / "saved"
    datasets.Dataset.from_list(_wikihop_rows(json.loads(dev.read_text())), features=WIKIHOP_FEATURES).save_to_disk(
        str(folder))
    assert _predict(trained, tmp_path / "official.json") == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["--quiet", "predict", "wikihop", "--model", str(model), "--data", str(folder),
                     "--out", str(tmp_path / "export.json")]) == 0
    official = json.loads((tmp_path / "official.json").read_text())
    assert len(official) == DEV_EXAMPLES and json.loads((tmp_path / "export.json").read_text()) == official
