"""Device and dtype resolution (longdoc.model.inference) on a machine without a GPU: every refusal's
message, by making torch report the devices it would find (and the CPU its bfloat16 instructions);
models moved in dtype, refused on "meta" or with an attention backend that cannot run there; outputs
back in float32 whatever the model's dtype."""

import warnings
from itertools import islice

import pytest
import torch

from longdoc.convert.pretrained import default_tokenizer
from longdoc.errors import InputError
from longdoc.model import linear
from longdoc.model.inference import default_device, place_model, resolve_device, resolve_placement
from longdoc.data.features import GlobalMarkers
from longdoc.model.config import GlobalLocalConfig
from longdoc.tasks.wikihop.features import CutCounter, collate, example_window, feature_settings, window_inputs
from longdoc.tasks.wikihop.model import WikiHopModel
from longdoc.tasks.wikihop.reader import read_examples


@pytest.fixture
def machine(monkeypatch):
    """A function that makes torch report `cuda` CUDA devices (built with CUDA or not) and an MPS device or none."""

    def pretend(cuda: int = 0, built_with_cuda: bool = True, mps: bool = False, bf16: bool = True,
                cpu_bf16: bool = True) -> None:
        monkeypatch.setattr(linear, "bfloat16_instructions", lambda: cpu_bf16)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: cuda)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: bf16)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100-SXM2-16GB")
        monkeypatch.setattr(torch.version, "cuda", "12.4" if built_with_cuda else None)
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)

    return pretend


def test_the_default_is_cuda_then_mps_then_cpu(machine):
    machine(cuda=2, mps=True)
    assert default_device() == "cuda" and resolve_device(None) == torch.device("cuda", 0)
    machine(cuda=0, mps=True)
    assert default_device() == "mps" and resolve_device(None) == torch.device("mps")
    machine(cuda=0, mps=False)
    assert default_device() == "cpu" and resolve_placement(None, None) == (torch.device("cpu"), torch.float32)


def test_device_names_resolve(machine):
    machine(cuda=2)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("cpu") == resolve_device("cpu:0") == torch.device("cpu")
    assert resolve_placement("cpu", "bfloat16") == (torch.device("cpu"), torch.bfloat16)
    assert resolve_placement("cuda:0", "float16") == (torch.device("cuda", 0), torch.float16)


def test_bfloat16_on_a_cpu_without_its_instructions_is_refused(machine):
    # Measured (docs/benchmarks.md, "Precision on the CPU"): there bfloat16 predicts 2-4 times slower than float32.
    machine(cpu_bf16=False)
    with pytest.raises(InputError) as refused:
        resolve_placement("cpu", "bfloat16")
    assert str(refused.value) == ("--dtype bfloat16 (--bf16): this CPU has no bfloat16 instructions (AVX512_BF16 or "
                                  "AMX), where bfloat16 runs slower than float32; use float32 (the default)")
    assert resolve_placement("cpu", "float32") == (torch.device("cpu"), torch.float32)
    assert resolve_placement("cpu", "float16") == (torch.device("cpu"), torch.float16)  # (not measured: as before)
    machine(cuda=1, cpu_bf16=False)  # a GPU's bfloat16 is the GPU's
    assert resolve_placement("cuda", "bfloat16") == (torch.device("cuda", 0), torch.bfloat16)


@pytest.mark.parametrize("avx512_bf16, amx, onednn_uses_them, expected",
                         [(True, False, True, True), (False, True, True, True), (False, False, False, False),
                          (True, False, False, False)])  # (the last: ONEDNN_MAX_CPU_ISA=AVX2 withholds them)
def test_the_cpus_bfloat16_instructions_are_avx512_bf16_or_amx_where_onednn_uses_them(
        monkeypatch, avx512_bf16, amx, onednn_uses_them, expected):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(linear, "_onednn_available", lambda: True)
    monkeypatch.setattr(linear, "_onednn_uses_bfloat16_instructions", lambda: onednn_uses_them)
    linear.bfloat16_instructions.cache_clear()
    try:
        assert linear.bfloat16_instructions() is expected
    finally:
        linear.bfloat16_instructions.cache_clear()


@pytest.mark.parametrize("name, machine_has, message", [
    ("gpu0", {}, "--device gpu0: not a device name; use one of cpu, cuda, cuda:N, mps"),
    ("cuda1", {}, "--device cuda1: not a device name; use one of cpu, cuda, cuda:N, mps"),
    ("cuda", dict(cuda=0, built_with_cuda=False),
     "--device cuda: this machine has no CUDA device (torch was built without CUDA); use --device cpu"),
    ("cuda:0", dict(cuda=0, built_with_cuda=True),
     "--device cuda:0: this machine has no CUDA device (torch finds no CUDA device); use --device cpu"),
    ("cuda:7", dict(cuda=1), "--device cuda:7: this machine has 1 CUDA device (cuda:0)"),
    ("cuda:2", dict(cuda=2), "--device cuda:2: this machine has 2 CUDA devices (cuda:0, cuda:1)"),
    ("mps", dict(mps=False), "--device mps: this machine has no MPS device (Apple silicon GPU); use --device cpu"),
    ("cpu:1", {}, "--device cpu:1: there is one cpu device, cpu (cpu:0)"),
])
def test_a_device_this_machine_lacks_is_refused_by_name(machine, name, machine_has, message):
    machine(**machine_has)
    with pytest.raises(InputError) as refused:
        resolve_device(name)
    assert str(refused.value) == message


def test_bfloat16_on_a_gpu_without_it_is_refused(machine):
    machine(cuda=1, bf16=False)
    with pytest.raises(InputError) as refused:
        resolve_placement("cuda", "bfloat16")
    assert str(refused.value) == ("--dtype bfloat16: cuda:0 (Tesla V100-SXM2-16GB) cannot run bfloat16; "
                                  "use --dtype float16 or float32")
    with pytest.raises(InputError, match="--dtype int8: use one of float32, bfloat16, float16"):
        resolve_placement("cpu", "int8")


@pytest.fixture(scope="module")
def tiny_model_config():
    config = GlobalLocalConfig(vocab_size=default_tokenizer().vocab_size, hidden_size=32, num_hidden_layers=2,
                               num_attention_heads=2, intermediate_size=64, local_radius=8, long_max_len=128,
                               global_max_len=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    config.task_options = {**WikiHopModel.default_task_options, "max_question_len": 16}
    return config


def test_place_model_casts_every_floating_tensor_and_keeps_integer_buffers(tiny_model_config):
    torch.manual_seed(0)
    model = place_model(WikiHopModel(tiny_model_config).train(), torch.device("cpu"), torch.bfloat16, "tiny")
    floating = [tensor for tensor in [*model.parameters(), *model.buffers()] if tensor.is_floating_point()]
    assert floating and {tensor.dtype for tensor in floating} == {torch.bfloat16}
    assert {tensor.dtype for tensor in model.buffers() if not tensor.is_floating_point()} <= {torch.int64, torch.int32}
    assert not model.training and model.device == torch.device("cpu")


def test_a_model_on_meta_is_refused_before_it_runs(tiny_model_config):
    with torch.device("meta"):
        model = WikiHopModel(tiny_model_config)
    with pytest.raises(InputError) as refused:
        place_model(model, torch.device("cpu"), torch.float32, "runs/broken")
    assert str(refused.value).startswith("runs/broken: the model's weights were not loaded (")
    assert "tensors on the meta device, e.g. encoder." in str(refused.value)


def test_place_model_sets_the_attention_backend_or_refuses_one_that_cannot_run(tiny_model_config,
                                                                               without_triton_interpreter):
    cpu = torch.device("cpu")
    model = place_model(WikiHopModel(tiny_model_config), cpu, torch.float32, "tiny", attention="dense")
    assert model.encoder.attention_backend == "dense" and model.config.attention_backend == "auto"
    with pytest.raises(InputError) as refused:
        place_model(WikiHopModel(tiny_model_config), cpu, torch.float16, "tiny", attention="cpu")
    assert str(refused.value) == ("--attention cpu: attention backend 'cpu' cannot run on cpu in float16: the C++ "
                                  "kernels run on the CPU in float32, and in bfloat16 on float32 copies; there eager, "
                                  "dense can (or auto, which picks one)")
    with pytest.raises(InputError, match=r"^--attention fast: 'fast' is not an attention backend; use one of auto, "):
        place_model(WikiHopModel(tiny_model_config), cpu, torch.float32, "tiny", attention="fast")
    saved_for_a_gpu = GlobalLocalConfig.from_dict({**tiny_model_config.to_dict(), "attention_backend": "gpu"})
    with pytest.raises(InputError, match=r"^runs/gpu \(attention_backend in its config\): attention backend 'gpu' "
                                         r"cannot run on cpu in float32: the GPU kernel runs on CUDA tensors only"):
        place_model(WikiHopModel(saved_for_a_gpu), cpu, torch.float32, "runs/gpu")


def test_outputs_of_a_bfloat16_model_come_back_float32_and_close(tiny_model_config, shared_data):
    torch.manual_seed(0)
    full = WikiHopModel(tiny_model_config).eval()
    half = place_model(WikiHopModel(tiny_model_config), torch.device("cpu"), torch.bfloat16, "tiny")
    half.load_state_dict(full.state_dict())  # the same weights, rounded to bfloat16 on the way in
    tokenizer, settings = default_tokenizer(), feature_settings(tiny_model_config)
    markers = GlobalMarkers.from_tokenizer(tokenizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # supports cut at 128 wordpieces
        examples = list(islice(read_examples(shared_data / "wikihop/wikihop_dev.first28.json"), 5))
        rows = [window_inputs(example_window(example, tokenizer, settings, markers, CutCounter()))
                for example in examples]
    expected = full.forward_rows(rows, collate, batch_size=2, progress=False)
    got = half.forward_rows(rows, collate, batch_size=2, progress=False)
    for row, want, have in zip(rows, expected, got):
        assert have["candidate_logits"].dtype == want["candidate_logits"].dtype == torch.float32
        candidates = torch.tensor(row["candidate_mask"]).bool()
        # This random model's candidate logits differ by about 0.06 (standard deviation) and move by
        # at most 1.5e-3 in bfloat16 (8 bits of mantissa): a tolerance well under their spread.
        assert torch.allclose(have["candidate_logits"][:len(candidates)][candidates],
                              want["candidate_logits"][:len(candidates)][candidates], atol=5e-3)
