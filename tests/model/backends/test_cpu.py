"""The cpu backend (the compiled C++ kernels, longdoc.model.backends.cpu) against the float64 dense
reference and against the eager backend on CPU float32: outputs with and without autograd,
gradients, dropout, the long keys hard g2l lets it skip. (The float64 tests in test_attention.py run
the eager backend; tests/model/backends/test_backends.py holds every backend to the references.)"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from longdoc.model.kernels import cpu as kernels
from tests.model.conftest import make_inputs, tiny_config
from tests.model.dense_gradients import assert_gradients_equal_dense
from tests.model.dense_reference import dense_forward
from tests.model.test_attention import make_model


CONFIGS = {
    "residual": dict(residual_attention=True),
    "plain": dict(residual_attention=False),
    "residual-mean": dict(residual_attention=True, residual_attention_mean=True),
    "absolute": dict(position_embedding_type="absolute"),
    "hard-l2g,within-paragraph": dict(hard_l2g=True, local_attention_within_paragraph=True),
    "k>window": dict(local_radius=1, max_relative_distance=5, relative_vocab_size=14),
    "talking-heads": dict(talking_heads=True),
    "talking-heads,plain": dict(talking_heads=True, residual_attention=False),
    # The kernel looks relative terms up in registers for up to 64 ids (ids 32-63 in a second pair),
    # and gathers them beyond.
    "ids-beyond-32": dict(local_radius=17, max_relative_distance=16, relative_vocab_size=40),
    "vocabulary-beyond-64": dict(relative_vocab_size=70),
    "cross-kv": dict(cross_kv_projections=True),
}


@pytest.mark.parametrize("overrides", CONFIGS.values(), ids=CONFIGS.keys())
@pytest.mark.parametrize("length,num_globals", [(13, 4), (30, 7), (3, 0)])
def test_kernel_outputs_equal_dense_reference(kernel, overrides, length, num_globals):
    reference_model = make_model(tiny_config(**overrides))
    inputs = make_inputs(2, length, num_globals, padding=True, structure=True)
    long_reference, global_reference = dense_forward(reference_model, inputs)
    model = make_model(tiny_config(**overrides)).float()
    long_mask = inputs["long_attention_mask"].bool()
    for grad_enabled in (True, False):  # fresh tensors / buffers reused in place between layers
        with torch.set_grad_enabled(grad_enabled):
            output = model(**inputs)
        torch.testing.assert_close(output.long_hidden_state[long_mask].double(), long_reference[long_mask],
                                   atol=2e-5, rtol=0)
        if num_globals:
            global_mask = inputs["global_attention_mask"].bool()
            torch.testing.assert_close(output.global_hidden_state[global_mask].double(),
                                       global_reference[global_mask], atol=2e-5, rtol=0)


@pytest.mark.parametrize("hard_g2l", [False, True], ids=["no-hard-g2l", "hard-g2l"])
def test_kernel_outputs_equal_dense_reference_for_packed_examples(kernel, hard_g2l):
    # Packed rows narrow the long keys each global query sees (global_key_ranges) with hard g2l or without.
    inputs = make_inputs(2, 30, 7, padding=True, structure=True, packed=True)
    long_reference, global_reference = dense_forward(make_model(tiny_config(hard_g2l=hard_g2l)), inputs)
    output = make_model(tiny_config(hard_g2l=hard_g2l)).float()(**inputs)
    long_mask, global_mask = inputs["long_attention_mask"].bool(), inputs["global_attention_mask"].bool()
    torch.testing.assert_close(output.long_hidden_state[long_mask].double(), long_reference[long_mask], atol=2e-5, rtol=0)
    torch.testing.assert_close(output.global_hidden_state[global_mask].double(), global_reference[global_mask],
                               atol=2e-5, rtol=0)


GRADIENT_CONFIGS = ("residual", "plain", "k>window", "talking-heads", "cross-kv")


@pytest.mark.parametrize("overrides", [CONFIGS[name] for name in GRADIENT_CONFIGS], ids=GRADIENT_CONFIGS)
def test_kernel_gradients_equal_dense_gradients(kernel, overrides):
    length, num_globals = 13, 4
    inputs = make_inputs(2, length, num_globals, padding=True, structure=True)
    weights = torch.randn(2, length, 16, dtype=torch.float64), torch.randn(2, num_globals, 16, dtype=torch.float64)
    assert_gradients_equal_dense(overrides, inputs, weights, "relative_key")


@pytest.mark.parametrize("talking_heads", [False, True], ids=["plain", "talking-heads"])
def test_kernel_matches_eager_path_at_a_realistic_width(kernel, monkeypatch, talking_heads):
    # Rows of 3b + G = 87 keys (not a multiple of the vector width), 10 blocks (the backward's
    # tasks and talking heads' rounds of blocks three apart), 4 heads: outputs and gradients of the
    # kernel against the eager float32 path, which LONGDOC_KERNELS=0 selects.
    config = tiny_config(local_radius=20, long_max_len=256, max_position_embeddings=256, global_max_len=32,
                         talking_heads=talking_heads)
    inputs = make_inputs(2, 200, 24, padding=True, structure=True)
    model = make_model(config).float()
    with torch.no_grad():
        fused = model(**inputs)
        monkeypatch.setenv(kernels.ENVIRONMENT_VARIABLE, "0")
        eager = model(**inputs)
    torch.testing.assert_close(fused.long_hidden_state, eager.long_hidden_state, atol=1e-5, rtol=0)
    torch.testing.assert_close(fused.global_hidden_state, eager.global_hidden_state, atol=1e-5, rtol=0)

    def gradients(kernels_on: bool) -> dict:
        monkeypatch.setenv(kernels.ENVIRONMENT_VARIABLE, "1" if kernels_on else "0")
        model.zero_grad()
        output = model(**inputs)
        (output.long_hidden_state.square().mean() + output.global_hidden_state.square().mean()).backward()
        return {name: parameter.grad.clone() for name, parameter in model.named_parameters()
                if parameter.grad is not None}

    compiled, eager_gradients = gradients(True), gradients(False)
    for name, grad in eager_gradients.items():
        torch.testing.assert_close(compiled[name], grad, atol=1e-5, rtol=1e-3, msg=name)


@pytest.mark.parametrize("talking_heads", [False, True], ids=["plain", "talking-heads"])
def test_kernel_dropout_draws_the_eager_paths_masks(kernel, monkeypatch, talking_heads):
    # In training the compiled softmax draws dropout's keep mask of the weights' shape at the point
    # where the eager path's Dropout draws it, so one seed gives both paths the same masks: outputs
    # and gradients agree, and differ from a run with another seed (dropout acted).
    config = tiny_config(attention_probs_dropout_prob=0.3, hidden_dropout_prob=0.1, talking_heads=talking_heads)
    inputs = make_inputs(2, 30, 7, padding=True, structure=True)

    def run(kernels_on: bool, seed: int):
        monkeypatch.setenv(kernels.ENVIRONMENT_VARIABLE, "1" if kernels_on else "0")
        model = make_model(config).float().train()
        torch.manual_seed(seed)
        output = model(**inputs)
        (output.long_hidden_state.square().sum() + output.global_hidden_state.square().sum()).backward()
        return output.long_hidden_state, {name: p.grad for name, p in model.named_parameters() if p.grad is not None}

    compiled_hidden, compiled_grads = run(True, seed=5)
    eager_hidden, eager_grads = run(False, seed=5)
    torch.testing.assert_close(compiled_hidden, eager_hidden, atol=1e-5, rtol=0)
    for name, grad in eager_grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, atol=1e-4, rtol=1e-4, msg=name)
    other_seed_hidden, _ = run(True, seed=6)
    assert (other_seed_hidden - compiled_hidden).abs().max() > 1e-2


@pytest.mark.parametrize("talking_heads", [False, True], ids=["plain", "talking-heads"])
@pytest.mark.parametrize("dropout", [0.0, 0.3], ids=["no-dropout", "dropout"])
def test_kernel_skips_the_long_keys_hard_g2l_hides_from_sentence_globals(kernel, monkeypatch, dropout, talking_heads):
    # 250 globals, each the sentence of 4 long tokens; under hard g2l it sees only those, except the
    # first three, which see every long token. The first chunk of global queries holds the three and
    # computes every long key; the others skip all but their sentences' tokens.
    # Outputs (residual attention carries the scores between layers) and gradients against the eager path.
    from longdoc.model.backends import cpu

    config = tiny_config(long_max_len=1024, max_position_embeddings=1024, global_max_len=256,
                         attention_probs_dropout_prob=dropout, talking_heads=talking_heads)
    inputs = make_inputs(2, 1000, 250, padding=True, structure=False)
    inputs["sentence_ids"] = (torch.arange(1000) // 4).expand(2, -1).clone()
    inputs["sentence_ids"][1, 600:] = -1  # row 1's padding
    inputs["global_attention_mask"][1, 150:] = 0
    inputs["global_sees_all"] = torch.zeros(2, 250, dtype=torch.bool)
    inputs["global_sees_all"][:, :3] = True
    model = make_model(config).float().train(dropout > 0)

    ranges = []
    real_ranges = cpu.global_key_ranges
    monkeypatch.setattr(cpu, "global_key_ranges", lambda *args: ranges.append(real_ranges(*args)) or ranges[-1])

    def run(kernels_on: bool):
        monkeypatch.setenv(kernels.ENVIRONMENT_VARIABLE, "1" if kernels_on else "0")
        model.zero_grad()
        torch.manual_seed(3)
        output = model(**inputs)
        (output.long_hidden_state.square().mean() + output.global_hidden_state.square().mean()).backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        return output.long_hidden_state, output.global_hidden_state, grads

    compiled, eager = run(True), run(False)
    monkeypatch.setenv(kernels.ENVIRONMENT_VARIABLE, "1")
    with torch.no_grad():  # nothing kept for a backward: the summed scores written over the carried ones
        torch.manual_seed(3)
        inference = model(**inputs)
    torch.testing.assert_close(inference.long_hidden_state, eager[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(inference.global_hidden_state, eager[1], atol=1e-5, rtol=0)
    assert len(ranges) == 2  # once per forward pass of the cpu backend, not once per layer
    assert ranges[0][0, 200].tolist() == [800, 804]  # global 200 owns long tokens 800-803
    assert ranges[0][0, 1].tolist() == [0, 1000] and ranges[0][1, 1].tolist() == [0, 667]  # sees all (but padding)
    assert ranges[0][1, 200].tolist() == [0, 0]  # a padding global: no long token
    torch.testing.assert_close(compiled[0], eager[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(compiled[1], eager[1], atol=1e-5, rtol=0)
    for name, grad in eager[2].items():  # (the mixes' gradients are ~1e-5: the tolerance is relative to each's scale)
        torch.testing.assert_close(compiled[2][name], grad, atol=1e-4 * grad.abs().max().item(), rtol=1e-3, msg=name)


@pytest.mark.parametrize("talking_heads", [False, True], ids=["plain", "talking-heads"])
def test_inference_keeps_no_weights_for_a_backward(kernel, monkeypatch, talking_heads):
    # A custom autograd function sees ctx.needs_input_grad True for parameters under no_grad too:
    # the kernels must still be handed no weights to keep (probs_out) there, and some with autograd.
    forward_name = "talking_heads_forward" if talking_heads else "attention_forward"
    handed = []

    class Spy:
        def __getattr__(self, name):
            function = getattr(kernel, name)
            if name != forward_name:
                return function
            return lambda **arguments: handed.append(arguments["probs_out"]) or function(**arguments)

    monkeypatch.setattr(kernels, "compiled", lambda: Spy())
    monkeypatch.setenv(kernels.ENVIRONMENT_VARIABLE, "1")
    model = make_model(tiny_config(talking_heads=talking_heads)).float()
    inputs = make_inputs(2, 30, 7, padding=True, structure=True)
    for mode in (torch.no_grad, torch.inference_mode):
        with mode():
            model(**inputs)
        assert len(handed) == 6 and all(probs is None for probs in handed), mode.__name__  # 3 layers x 2 softmaxes
        handed.clear()
    model(**inputs)
    assert len(handed) == 6 and all(probs is not None and probs.shape[-1] > 0 for probs in handed)


@pytest.mark.parametrize("talking_heads", [False, True], ids=["plain", "talking-heads"])
def test_a_nan_score_reaches_the_output_as_in_the_eager_path(kernel, monkeypatch, talking_heads):
    # NaN in every long key (one dimension of one head), values finite: the long queries' scores over
    # long keys are NaN, those over the globals are not. A softmax that read NaN as a weight of 0
    # would attend to the globals alone and return finite, silently wrong outputs.
    model = make_model(tiny_config(talking_heads=talking_heads)).float()
    with torch.no_grad():
        model.encoder.layers[0].attention.long_qkv.bias[model.config.hidden_size] = float("nan")
    inputs = make_inputs(2, 30, 7, padding=True, structure=True)
    outputs = {}
    for kernels_on in ("1", "0"):
        monkeypatch.setenv(kernels.ENVIRONMENT_VARIABLE, kernels_on)
        with torch.no_grad():
            outputs[kernels_on] = model(**inputs).long_hidden_state.isnan()
    assert outputs["0"].any()
    assert torch.equal(outputs["1"], outputs["0"])


@pytest.fixture
def own_products(kernel):
    """A function that turns the kernel's own AVX-512 or AVX2 products on or off (True if they are on);
    the process's choice is restored afterwards."""
    yield kernel.use_own_products
    kernel.use_own_products(kernels.wants_own_products())


# Head sizes: below one vector (the packing's masked lanes), whole vectors (d = 16 .. 64: the
# context product's own path), and between (the context product falls back to BLAS).
@pytest.mark.parametrize("head_size", [4, 16, 20, 32, 64])
@pytest.mark.parametrize("talking_heads", [False, True])
def test_own_products_equal_dense_reference_and_blas(kernel, own_products, head_size, talking_heads):
    if not own_products(True):
        pytest.skip("the kernel was built with neither AVX-512 nor AVX2: its own products are not compiled")
    # Blocks of 14 queries (radius 13): a 12-row tile and a 2-row rest; 31 keys: a 32-column tile's mask.
    overrides = dict(hidden_size=2 * head_size, num_attention_heads=2, local_radius=13, max_relative_distance=4,
                     relative_vocab_size=12, residual_attention=True, talking_heads=talking_heads)
    inputs = make_inputs(2, 41, 6, padding=True, structure=True)
    long_mask, global_mask = inputs["long_attention_mask"].bool(), inputs["global_attention_mask"].bool()
    long_reference, global_reference = dense_forward(make_model(tiny_config(**overrides)), inputs)
    results = {}
    for own in (True, False):
        own_products(own)
        model = make_model(tiny_config(**overrides)).float().train()
        output = model(**inputs)
        (output.long_hidden_state.pow(2).sum() + output.global_hidden_state.sum()).backward()
        results[own] = output, {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
        torch.testing.assert_close(output.long_hidden_state[long_mask].double(), long_reference[long_mask],
                                   atol=2e-5, rtol=0)
        torch.testing.assert_close(output.global_hidden_state[global_mask].double(), global_reference[global_mask],
                                   atol=2e-5, rtol=0)
    (own_output, own_grads), (blas_output, blas_grads) = results[True], results[False]
    torch.testing.assert_close(own_output.long_hidden_state, blas_output.long_hidden_state, atol=1e-5, rtol=1e-5)
    assert own_grads.keys() == blas_grads.keys()
    for name in own_grads:
        torch.testing.assert_close(own_grads[name], blas_grads[name], atol=1e-4, rtol=1e-4, msg=name)


@pytest.mark.slow
def test_the_avx2_build_equals_the_dense_reference_too():
    # The kernels follow the instruction set torch dispatches to, so on an AVX-512 machine (CI's) the
    # AVX2 build runs only where ATEN_CPU_CAPABILITY=avx2 says so: this file's reference checks again,
    # in a process that does, with its own products on and off.
    if not torch.cpu._is_avx2_supported():
        pytest.skip("this CPU has no AVX2")
    script = (
        "import sys, pytest, torch\n"
        "from longdoc.model.kernels import cpu\n"
        "assert torch.backends.cpu.get_cpu_capability() == 'AVX2', torch.backends.cpu.get_cpu_capability()\n"
        "assert '-mavx2' in cpu._compile_flags() and '-mavx512f' not in cpu._compile_flags(), cpu._compile_flags()\n"
        "assert cpu.compiled() is not None, cpu.failure()\n"
        f"sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-rs', {__file__!r}, '-k', "
        "'(dense_reference or dense_gradients or own_products) and not avx2']))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], env={**os.environ, "ATEN_CPU_CAPABILITY": "avx2"},
                         cwd=Path(__file__).resolve().parents[3], capture_output=True, text=True, timeout=3600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    summary = run.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary and "deselected" in summary, summary
