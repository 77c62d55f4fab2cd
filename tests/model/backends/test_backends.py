"""Every attention backend against the float64 dense reference (tests/model/dense_reference.py) over
masks, packed rows, cross projections, talking heads, residual attention on and off and its running
mean, forward and gradients; the weights they return on request; how `auto` chooses and how a backend
that cannot run is refused.

The gpu backend runs on a CUDA GPU, or without one in its interpreter mode (TRITON_INTERPRET=1, which
tests/conftest.py sets where there is no CUDA GPU): Triton's interpreter runs its kernels on CPU tensors.
"""

import pytest
import torch

from longdoc import GlobalLocalConfig, GlobalLocalModel
from longdoc.model.backends import BACKEND_NAMES, AttentionBackendError
from longdoc.model.backends.cpu import CpuBackend
from longdoc.model.backends.eager import EagerBackend
from longdoc.model.backends.gpu import GpuBackend
from longdoc.model.backends.resolution import BACKENDS, refusal, resolve_backend
from longdoc.model.backends.upcast import UpcastCpuBackend
from longdoc.model.kernels import cpu as cpu_kernels
from longdoc.model.kernels.gpu import interpreter_failure, interpreting, triton_failure
from tests.model.conftest import make_inputs, tiny_config
from tests.model.dense_reference import dense_forward
from tests.model.test_attention import make_model

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
# Where each backend runs in these tests, and how close to the float64 reference it comes there: the
# outputs' absolute tolerance, the gradients' absolute and relative ones.
PLACES = {"eager": (CPU, torch.float64, 1e-10, (1e-9, 1e-7)), "dense": (CPU, torch.float64, 1e-10, (1e-9, 1e-7)),
          "cpu": (CPU, torch.float32, 2e-5, (1e-4, 1e-3)),
          "gpu": (CPU if interpreting() else CUDA, torch.float32, 2e-5, (1e-4, 1e-3))}


def backends(*names: str) -> list:
    """`names` as test parameters, the gpu backend's marked slow in its interpreter mode (a model's
    forward pass takes seconds there; its kernels' own tests, tests/model/test_gpu_kernel.py, are fast)."""
    return [pytest.param(name, marks=pytest.mark.slow) if name == "gpu" and interpreting() else name
            for name in names]

CONFIGS = {
    "residual": dict(residual_attention=True),
    "plain": dict(residual_attention=False),
    "running-mean": dict(residual_attention=True, residual_attention_mean=True),
    "talking-heads": dict(talking_heads=True),
    "talking-heads,plain": dict(talking_heads=True, residual_attention=False),
    "cross-kv": dict(cross_kv_projections=True),
    "hard-l2g,within-paragraph,no-hard-g2l": dict(hard_l2g=True, local_attention_within_paragraph=True,
                                                  hard_g2l=False),
    "absolute": dict(position_embedding_type="absolute"),
}


def layers_for(backend: str, overrides: dict) -> dict:
    """`overrides`, with 2 layers for the gpu backend in its interpreter mode (tiny_config's 3
    elsewhere): the fewest that hand residual scores, and the running mean, from a layer to the next,
    where a third layer runs the same kernels on the same flags again (seconds each there)."""
    return {**overrides, "num_hidden_layers": 2} if backend == "gpu" and interpreting() else overrides


def shape_for(backend: str, shape: tuple[int, int] = (17, 6)) -> tuple[int, int]:
    """(long tokens, global tokens) of the inputs: `shape`, or 9 and 3 for the gpu backend in its
    interpreter mode, where each block of long queries is a program run in Python (seconds a forward
    pass): 9 tokens are three blocks of r + 1 = 4, the last padded, so a first, a middle and a last
    block, a padded row's masked tail, two packed examples of long and of global tokens, and a masked
    global token, as at 13 or 17."""
    return (9, 3) if backend == "gpu" and interpreting() else shape


def model_on(backend: str, overrides: dict) -> GlobalLocalModel:
    """make_model's model (non-trivial relative tables, mixes and biases) where `backend` runs, computing
    its attention there; skipped where it cannot run."""
    device, dtype, *_ = PLACES[backend]
    why = refusal(backend, device, dtype)
    if why is not None:
        pytest.skip(why)
    model = make_model(tiny_config(**overrides)).to(device, dtype)
    model.set_attention_backend(backend)
    return model


def on(device, inputs: dict) -> dict:
    return {name: value.to(device) for name, value in inputs.items()}


@pytest.mark.parametrize("backend", backends(*PLACES))
@pytest.mark.parametrize("overrides", CONFIGS.values(), ids=CONFIGS.keys())
@pytest.mark.parametrize("packed", [False, True], ids=["one-example", "packed"])
def test_every_backend_equals_the_dense_reference(backend, overrides, packed):
    overrides = layers_for(backend, overrides)
    model = model_on(backend, overrides)
    device, _, tolerance, _ = PLACES[backend]
    inputs = make_inputs(2, *shape_for(backend), padding=True, structure=True, packed=packed)
    long_reference, global_reference = dense_forward(make_model(tiny_config(**overrides)), inputs)
    long_mask, global_mask = inputs["long_attention_mask"].bool(), inputs["global_attention_mask"].bool()
    for grad_enabled in (True, False):  # fresh tensors / buffers handed from layer to layer
        with torch.set_grad_enabled(grad_enabled):
            output = model(**on(device, inputs))
        torch.testing.assert_close(output.long_hidden_state.cpu().double()[long_mask], long_reference[long_mask],
                                   atol=tolerance, rtol=0)
        torch.testing.assert_close(output.global_hidden_state.cpu().double()[global_mask],
                                   global_reference[global_mask], atol=tolerance, rtol=0)


GRADIENT_CONFIGS = ("residual", "running-mean", "talking-heads", "cross-kv", "hard-l2g,within-paragraph,no-hard-g2l")


@pytest.mark.parametrize("backend", backends(*PLACES))
@pytest.mark.parametrize("overrides", [CONFIGS[name] for name in GRADIENT_CONFIGS], ids=GRADIENT_CONFIGS)
def test_every_backends_gradients_equal_the_dense_references(backend, overrides):
    overrides = layers_for(backend, overrides)
    model = model_on(backend, overrides)
    device, _, _, (atol, rtol) = PLACES[backend]
    length, num_globals = shape_for(backend, (13, 4))
    inputs = make_inputs(2, length, num_globals, padding=True, structure=True, packed=True)
    long_mask, global_mask = inputs["long_attention_mask"].bool(), inputs["global_attention_mask"].bool()
    weights = torch.randn(2, length, 16, dtype=torch.float64), torch.randn(2, num_globals, 16, dtype=torch.float64)

    def gradients(model, forward) -> dict:
        long_hidden, global_hidden = forward(model)
        long_hidden, global_hidden = long_hidden.cpu().double(), global_hidden.cpu().double()
        ((long_hidden * weights[0])[long_mask].sum() + (global_hidden * weights[1])[global_mask].sum()).backward()
        return {name: p.grad.cpu().double() for name, p in model.named_parameters() if p.grad is not None}

    def blocked(model):
        output = model(**on(device, inputs))
        return output.long_hidden_state, output.global_hidden_state

    got = gradients(model, blocked)
    expected = gradients(make_model(tiny_config(**overrides)), lambda model: dense_forward(model, inputs))
    assert got.keys() == expected.keys() and any("relative_key" in name for name in got)
    for name in got:
        torch.testing.assert_close(got[name], expected[name], atol=atol, rtol=rtol, msg=name)


@pytest.mark.parametrize("backend", backends("eager", "cpu", "dense", "gpu"))
@pytest.mark.parametrize("talking_heads", [False, True], ids=["plain", "talking-heads"])
def test_weights_on_request_are_softmax_rows_equal_to_the_dense_backends(backend, talking_heads):
    # The weights of every layer and softmax: 0 where the mask forbids, rows of 1 for every query
    # that may attend, the same as the dense backend's on the pairs a query may attend to.
    inputs = make_inputs(2, *shape_for(backend), padding=True, structure=True)
    overrides = layers_for(backend, dict(talking_heads=talking_heads))
    model = model_on(backend, overrides)
    device = PLACES[backend][0]
    assert model(**on(device, inputs)).attention_weights is None  # not asked for
    model.keep_attention_weights()
    output = model(**on(device, inputs))
    reference = model_on("dense", overrides)
    reference.keep_attention_weights()
    expected = reference(**inputs).attention_weights
    assert len(output.attention_weights) == model.config.num_hidden_layers
    long_mask, global_mask = mask_biases(model.config, inputs)
    for got, want in zip(output.attention_weights, expected):
        assert got.block_size == want.block_size == 4
        for weights, reference_weights, mask_bias in ((got.long.cpu(), want.long, long_mask),
                                                      (got.global_.cpu(), want.global_, global_mask)):
            assert weights.shape == reference_weights.shape == (2, 4, *mask_bias.shape[2:])
            allowed = (mask_bias == 0).expand_as(weights)
            real_queries = allowed.any(-1)  # (a padding query may attend to nothing)
            assert real_queries.sum() > 0 and torch.all(weights[~allowed] == 0)
            sums = weights.sum(-1)[real_queries]
            torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-6, rtol=0)
            pairs = real_queries.unsqueeze(-1) & allowed
            torch.testing.assert_close(weights[pairs].double(), reference_weights[pairs].double(), atol=2e-6, rtol=0)


def mask_biases(config: GlobalLocalConfig, inputs: dict):
    """The long and global softmaxes' masks for `inputs`: [B, 1, nb, b, 3b + G], [B, 1, G, G + Lp]."""
    from longdoc.model.inputs import check_and_collect
    from longdoc.model.side_inputs import build_side_inputs

    side = build_side_inputs(check_and_collect(config, inputs), local_radius=config.local_radius,
                             max_relative_distance=config.max_relative_distance, hard_g2l=config.hard_g2l,
                             hard_l2g=config.hard_l2g,
                             local_attention_within_paragraph=config.local_attention_within_paragraph,
                             dtype=torch.float32)
    return side.long_mask_bias, side.global_mask_bias


def test_auto_picks_by_device_and_dtype(monkeypatch):
    built = cpu_kernels.enabled() and cpu_kernels.compiled() is not None
    assert resolve_backend("auto", CPU, torch.float32) is (CpuBackend if built else EagerBackend)
    assert resolve_backend("auto", CPU, torch.bfloat16) is (UpcastCpuBackend if built else EagerBackend)
    # CUDA tensors in the kernel's dtypes run it where Triton imports, the eager backend otherwise.
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        assert resolve_backend("auto", CUDA, dtype) is (GpuBackend if triton_failure() is None else EagerBackend)
    assert resolve_backend("auto", CUDA, torch.float64) is EagerBackend
    assert resolve_backend("auto", torch.device("mps"), torch.float32) is EagerBackend
    monkeypatch.setenv(cpu_kernels.ENVIRONMENT_VARIABLE, "0")  # auto keeps off the kernels; asked by name, they run
    assert resolve_backend("auto", CPU, torch.float32) is EagerBackend
    if built:
        assert resolve_backend("cpu", CPU, torch.float32) is CpuBackend
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the gpu backend's interpreter mode only runs when named
    if interpreter_failure() is None:
        assert resolve_backend("gpu", CPU, torch.float32) is GpuBackend
    else:  # (an interpreter that cannot run the kernels says so, in one line)
        with pytest.raises(AttentionBackendError, match="interpreter cannot run the kernels' loops"):
            resolve_backend("gpu", CPU, torch.float32)
    for dtype in (torch.float32, torch.float16):
        assert resolve_backend("auto", CPU, dtype) is EagerBackend
    for name, backend in BACKENDS.items():
        assert backend.name == name and name in BACKEND_NAMES


@pytest.mark.parametrize("name,device,dtype,message", [
    ("cpu", CUDA, torch.bfloat16, "attention backend 'cpu' cannot run on cuda in bfloat16: the C++ kernels run on "
                                  "the CPU in float32 only; there eager, {gpu}dense can (or auto, which picks one)"),
    ("cpu", CPU, torch.float16, "attention backend 'cpu' cannot run on cpu in float16: the C++ kernels run on the "
                                "CPU in float32, and in bfloat16 on float32 copies; there eager, dense can (or auto, "
                                "which picks one)"),
    ("gpu", CPU, torch.float32, "attention backend 'gpu' cannot run on cpu in float32: the GPU kernel runs on CUDA "
                                "tensors only; there eager, {cpu}dense can (or auto, which picks one)"),
    ("gpu", CUDA, torch.float64, "attention backend 'gpu' cannot run on cuda in float64: the GPU kernel takes "
                                 "bfloat16, float16 or float32 tensors; there eager, dense can (or auto, which picks "
                                 "one)"),
])
def test_a_backend_that_cannot_run_is_refused_in_one_line_saying_what_can(name, device, dtype, message,
                                                                         without_triton_interpreter):
    message = message.format(cpu="cpu, " if cpu_kernels.compiled() is not None else "",
                             gpu="gpu, " if triton_failure() is None else "")
    assert refusal(name, device, dtype) == message
    with pytest.raises(AttentionBackendError) as refused:
        resolve_backend(name, device, dtype)
    assert str(refused.value) == message and "\n" not in message


def test_the_backend_is_chosen_by_config_and_overridden_at_run_time(monkeypatch, without_triton_interpreter):
    # The config's choice, saved with the model; set_attention_backend overrides it without changing it.
    chosen = []
    for backend in BACKENDS.values():
        original = backend.attend
        monkeypatch.setattr(backend, "attend", lambda self, operands, original=original: chosen.append(self.name)
                            or original(self, operands))
    model = GlobalLocalModel(tiny_config(attention_backend="dense", num_hidden_layers=2)).eval()
    inputs = make_inputs(1, 9, 3, padding=False, structure=True)
    model(**inputs)
    assert chosen == ["dense"] * 4  # 2 layers x 2 softmaxes
    chosen.clear()
    model.set_attention_backend("eager")
    model(**inputs)
    assert chosen == ["eager"] * 4 and model.config.attention_backend == "dense"
    model.set_attention_backend(None)
    chosen.clear()
    model(**inputs)
    assert chosen == ["dense"] * 4
    model.set_attention_backend("gpu")
    with pytest.raises(AttentionBackendError, match="attention backend 'gpu' cannot run on cpu in float32"):
        model(**inputs)
    with pytest.raises(AttentionBackendError, match="attention backend 'fast' is not one of auto, eager, cpu, gpu, dense"):
        model.set_attention_backend("fast")


def test_the_config_refuses_an_unknown_backend_and_loads_old_configs_as_auto(tmp_path):
    with pytest.raises(ValueError, match="attention_backend must be one of auto, eager, cpu, gpu, dense, got 'fast'"):
        tiny_config(attention_backend="fast")
    config = tiny_config()
    saved = config.to_dict()
    del saved["attention_backend"]  # a config saved before the field
    assert GlobalLocalConfig.from_dict(saved).attention_backend == "auto"
    tiny_config(attention_backend="eager").save_pretrained(tmp_path)
    assert GlobalLocalConfig.from_pretrained(tmp_path).attention_backend == "eager"


def test_under_autocast_the_backend_is_chosen_for_the_projections_dtype():
    # bfloat16 autocast on the CPU: the attention's inputs are bfloat16, which the cpu backend takes through
    # float32 copies (longdoc.model.backends.upcast).
    model = GlobalLocalModel(tiny_config()).eval()
    inputs = make_inputs(2, 13, 4, padding=True, structure=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(**inputs).long_hidden_state
        model.set_attention_backend("cpu" if cpu_kernels.compiled() is not None else "eager")
        torch.testing.assert_close(model(**inputs).long_hidden_state, expected, atol=0, rtol=0)  # what auto ran


@pytest.mark.parametrize("overrides", [CONFIGS[name] for name in ("residual", "talking-heads", "plain")],
                         ids=["residual", "talking-heads", "plain"])
def test_the_eager_backend_runs_inference_under_autocast(overrides):
    # Without autograd the eager backend writes into reused buffers (out=), which autocast does not
    # cast: found on an H200 (a converted ETC model under bfloat16 autocast, no_grad) as a dtype error.
    model = make_model(tiny_config(**overrides)).float().eval()
    model.set_attention_backend("eager")
    inputs = make_inputs(2, 13, 4, padding=True, structure=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.no_grad():
            inference = model(**inputs).long_hidden_state
        with_autograd = model(**inputs).long_hidden_state
    assert inference.dtype == torch.float32  # (the model's output: the last layer norm runs in float32)
    torch.testing.assert_close(inference, with_autograd.detach(), atol=0, rtol=0)
    with torch.no_grad():
        float32 = model(**inputs).long_hidden_state
    torch.testing.assert_close(inference.float(), float32, atol=0.1, rtol=0.05)  # (bfloat16 products)
