"""`longdoc convert etc|realformer` on the checkpoints Google's own model code wrote
(scripts/make_etc_reference.py, tests/fixtures/README.md): every variable read or dropped, outputs
equal to etcmodel's and RealFormer's on each fixture's batch, config fields mapped or refused, bad
input refused with exit 2 and nothing written."""

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from longdoc import cli
from longdoc.cli import main
from longdoc.convert.etc import LengthOptions, etc_config_to_longdoc, etcmodel_inputs, read_etc
from longdoc.convert.realformer import realformer_config_to_longdoc
from longdoc.convert.tf_checkpoint import TFCheckpoint
from longdoc.errors import InputError
from longdoc.model.pretrained import GlobalLocalModel

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ETC_CASES = sorted(path.name for path in (FIXTURES / "etc").iterdir())
REALFORMER_CASES = sorted(path.name for path in (FIXTURES / "realformer").iterdir())
PADDING = FIXTURES / "etc" / "padding"
RUNNING_MEAN = FIXTURES / "realformer" / "running_mean"
SMALL = LengthOptions(long_max_len=64, global_max_len=8)
ETC_DROPS = {"etc_document_bert/token_emb_lookup/embedding_table/lamb_m",
             "etc_document_bert/token_emb_lookup/embedding_table/lamb_v", "global_step"}


@pytest.fixture(autouse=True)
def only_the_convert_command(monkeypatch):
    # The parser imports every command module it lists; these tests need one.
    monkeypatch.setattr(cli, "COMMANDS", {"convert": "longdoc.commands.convert"})


def test_the_fixture_cases_are_all_here():
    assert len(ETC_CASES) == 13 and REALFORMER_CASES == ["padding", "running_mean"]


@pytest.mark.parametrize("name", ETC_CASES)
def test_every_etc_variable_is_read_or_dropped(name):
    converted = read_etc(FIXTURES / "etc" / name, SMALL)
    conversion = converted.conversion
    assert set(conversion.read) | set(conversion.dropped) == set(converted.checkpoint.entries)
    assert set(conversion.dropped) == ETC_DROPS
    # Every parameter of the model came from the checkpoint.
    assert set(conversion.state) == set(converted.model.state_dict())


def etc_outputs(model: GlobalLocalModel, case: Path) -> tuple[np.ndarray, np.ndarray]:
    """The model's (long, global) outputs on the inputs etcmodel received in `case`."""
    inputs, outputs = (np.load(case / f"{part}.npz") for part in ("inputs", "outputs"))
    with torch.no_grad():
        output = model.eval()(**etcmodel_inputs(inputs, outputs["long_valid"], outputs["global_valid"]))
    return output.long_hidden_state.numpy(), output.global_hidden_state.numpy()


def assert_equals_etcmodel(model: GlobalLocalModel, case: Path) -> None:
    """Long and global outputs at real tokens within 1e-4 of etcmodel's (padding rows mean nothing)."""
    long_output, global_output = etc_outputs(model, case)
    reference = np.load(case / "outputs.npz")
    long_valid, global_valid = reference["long_valid"].astype(bool), reference["global_valid"].astype(bool)
    np.testing.assert_allclose(long_output[long_valid], reference["long_output"][long_valid], atol=1e-4, rtol=0)
    np.testing.assert_allclose(global_output[global_valid], reference["global_output"][global_valid], atol=1e-4, rtol=0)


@pytest.mark.parametrize("kernels", ["1", "0"])
@pytest.mark.parametrize("name", ETC_CASES)
def test_converted_etc_equals_etcmodel(name, kernels, monkeypatch):
    monkeypatch.setenv("LONGDOC_KERNELS", kernels)
    assert_equals_etcmodel(read_etc(FIXTURES / "etc" / name, SMALL).model, FIXTURES / "etc" / name)


def test_separate_projections_convert_to_cross_projections():
    separate = read_etc(FIXTURES / "etc" / "separate_qkv", SMALL)
    attention = "etc_document_bert/global_local_transformer_layers/fused_att_layer_0/fused_global_local_att"
    layer = separate.model.encoder.layers[0].attention
    assert separate.model.config.cross_kv_projections and not separate.model.config.share_qkv
    np.testing.assert_array_equal(layer.long_queries_global_kv.weight[:32].detach().numpy(),
                                  separate.checkpoint.read(f"{attention}/l2g_key_projection/linear/kernel").T)
    np.testing.assert_array_equal(layer.global_queries_long_kv.bias[32:].detach().numpy(),
                                  separate.checkpoint.read(f"{attention}/g2l_value_projection/linear/bias"))
    # share_kv_projections: the l2l and g2g variables also make the l2g and g2l keys.
    share_kv = read_etc(FIXTURES / "etc" / "share_kv", SMALL)
    layer = share_kv.model.encoder.layers[0].attention
    np.testing.assert_array_equal(layer.long_queries_global_kv.weight[:32].detach().numpy(),
                                  share_kv.checkpoint.read(f"{attention}/l2l_key_projection/linear/kernel").T)
    np.testing.assert_array_equal(layer.global_queries_long_kv.weight[:32].detach().numpy(),
                                  share_kv.checkpoint.read(f"{attention}/g2g_key_projection/linear/kernel").T)


def test_variable_nothing_reads_is_named(monkeypatch):
    original = TFCheckpoint.__init__

    def with_extra_variable(self, prefix):
        original(self, prefix)
        self.entries["etc_document_bert/cpc/mystery_head"] = self.entries["global_step"]

    monkeypatch.setattr(TFCheckpoint, "__init__", with_extra_variable)
    with pytest.raises(InputError, match=r"variables that no rule of the ETC converter reads: etc_document_bert/cpc/mystery_head"):
        read_etc(PADDING, SMALL)


def test_heads_outside_the_encoder_are_refused_unless_encoder_only(tmp_path, monkeypatch, capsys):
    original = TFCheckpoint.__init__
    heads = ["cls/predictions/output_bias", "cls/predictions/transform/dense/kernel"]

    def with_heads(self, prefix):
        original(self, prefix)
        for name in heads:
            self.entries[name] = self.entries["global_step"]

    monkeypatch.setattr(TFCheckpoint, "__init__", with_heads)
    out = tmp_path / "out"
    assert main(["convert", "etc", "--from", str(PADDING), "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert f"variables that no rule of the ETC converter reads: {', '.join(heads)}" in error
    assert "give --encoder-only" in error and len(error.strip().splitlines()) == 1
    assert_nothing_written(out)
    assert main(["convert", "etc", "--from", str(PADDING), "--out", str(out), "--encoder-only", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert set(summary["dropped"]) == ETC_DROPS | set(heads)
    assert_equals_etcmodel(GlobalLocalModel.from_pretrained(out), PADDING)
    assert "outside the encoder" in (out / "README.md").read_text()


def test_missing_variable_is_named(monkeypatch):
    original = TFCheckpoint.__init__
    missing = "etc_document_bert/global_local_transformer_layers/fused_att_layer_1/layer_norm_1/beta"

    def without(self, prefix):
        original(self, prefix)
        del self.entries[missing]

    monkeypatch.setattr(TFCheckpoint, "__init__", without)
    with pytest.raises(InputError, match=rf"not ETC with this config: lacks {missing}"):
        read_etc(PADDING, SMALL)


def padding_config() -> dict:
    return json.loads((PADDING / "etc_config.json").read_text())


@pytest.mark.parametrize("field, value, message", [
    ("embedding_size", 8, "embeddings have the hidden size"),
    ("att_size_per_head", 4, "heads have hidden_size / num_attention_heads"),
    ("max_absolute_position_embeddings", 512, "separate long and global tables"),
    ("use_pre_activation_order", True, "no final LayerNorm"),
    ("hidden_act", "swish", "expected one of gelu, relu, tanh"),
    ("relative_vocab_size", None, "always uses relative positions"),
    ("relative_vocab_size", 6, "relative_vocab_size \\(6\\) must be at least"),
    ("use_longdoc_magic", True, "unknown field\\(s\\) use_longdoc_magic"),
])
def test_etc_config_field_refused_by_name(field, value, message):
    source = {**padding_config(), field: value}
    with pytest.raises(InputError, match=message) as error:
        etc_config_to_longdoc(source, Path("etc_config.json"), SMALL)
    assert str(error.value).startswith("etc_config.json: ")
    if "unknown" not in message and "must be at least" not in message:
        assert f"{field} = {json.dumps(value)}" in str(error.value)


def test_etc_config_fields_mapped_with_etcmodel_defaults():
    source = {"vocab_size": 40, "hidden_size": 16, "num_attention_heads": 2, "intermediate_size": 32}
    config = etc_config_to_longdoc(source, Path("etc_config.json"), SMALL)
    # Absent fields take EtcConfig's defaults, which differ from GlobalLocalConfig's in places.
    assert (config.hard_g2l, config.hard_l2g, config.share_qkv, config.share_feed_forward) == (False, False, True, True)
    assert (config.type_vocab_size, config.local_radius, config.max_relative_distance) == (16, 84, 12)
    assert (config.residual_attention, config.talking_heads, config.hidden_act) == (False, False, "gelu_new")
    assert not config.cross_kv_projections
    # share_kv_projections is ignored by etcmodel when share_qkv_projections is on.
    assert etc_config_to_longdoc({**source, "share_kv_projections": True}, Path("c"), SMALL).share_qkv
    separate = etc_config_to_longdoc({**source, "share_qkv_projections": False}, Path("c"), SMALL)
    assert separate.cross_kv_projections and not separate.share_qkv


def test_realformer_config_refused_by_name():
    source = json.loads((RUNNING_MEAN / "bert_config.json").read_text())
    config = realformer_config_to_longdoc(source, Path("bert_config.json"))
    assert (config.residual_attention, config.residual_attention_mean, config.global_max_len) == (True, True, 0)
    assert config.local_radius >= config.long_max_len == config.max_position_embeddings == 16
    with pytest.raises(InputError, match=r"bert_config.json: unknown field\(s\) embedding_size"):
        realformer_config_to_longdoc({**source, "embedding_size": 8}, Path("bert_config.json"))
    with pytest.raises(InputError, match=r'bert_config.json: hidden_act = "swish" cannot be converted'):
        realformer_config_to_longdoc({**source, "hidden_act": "swish"}, Path("bert_config.json"))


@pytest.mark.parametrize("kernels", ["1", "0"])
@pytest.mark.parametrize("name", REALFORMER_CASES)
def test_realformer_command_output_equals_realformer(tmp_path, name, kernels, monkeypatch, capsys):
    monkeypatch.setenv("LONGDOC_KERNELS", kernels)
    case, out = FIXTURES / "realformer" / name, tmp_path / "realformer"
    assert main(["convert", "realformer", "--from", str(case), "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["pretraining_heads"] == ["cpc_projection.bias", "cpc_projection.weight", "mlm_bias",
                                            "mlm_transform.dense.bias", "mlm_transform.dense.weight",
                                            "mlm_transform.layer_norm.bias", "mlm_transform.layer_norm.weight"]
    assert set(summary["dropped"]) == {
        "bert/pooler/dense/kernel", "bert/pooler/dense/bias", "cls/seq_relationship/output_weights",
        "cls/seq_relationship/output_bias", "bert/embeddings/word_embeddings/adam_m",
        "bert/embeddings/word_embeddings/adam_v", "global_step"}
    inputs, reference = np.load(case / "inputs.npz"), np.load(case / "outputs.npz")
    model = GlobalLocalModel.from_pretrained(out).eval()
    with torch.no_grad():
        output = model(**{name: torch.tensor(inputs[source], dtype=torch.long) for name, source in (
            ("long_input_ids", "input_ids"), ("long_attention_mask", "input_mask"), ("long_token_type_ids", "token_type_ids"))})
    valid = reference["valid"]
    np.testing.assert_allclose(output.long_hidden_state.numpy()[valid], reference["sequence_output"][valid],
                               atol=1e-4, rtol=0)


def test_realformer_mlm_head_is_what_pretraining_reads(tmp_path):
    from safetensors.torch import load_file

    from longdoc.model.pretraining import HEADS_FILE, GlobalLocalForPretraining

    out = tmp_path / "realformer"
    # --from may name the checkpoint's prefix instead of its folder.
    assert main(["convert", "realformer", "--from", str(RUNNING_MEAN / "model.ckpt-1000"), "--out", str(out)]) == 0
    model = GlobalLocalForPretraining.from_encoder(out)
    checkpoint = TFCheckpoint(RUNNING_MEAN / "model.ckpt-1000")
    np.testing.assert_array_equal(model.mlm_bias.detach().numpy(), checkpoint.read("cls/predictions/output_bias"))
    np.testing.assert_array_equal(model.mlm_transform.dense.weight.detach().numpy(),
                                  checkpoint.read("cls/predictions/transform/dense/kernel").T)
    np.testing.assert_array_equal(model.cpc_projection.weight.detach().numpy(), np.eye(32, dtype=np.float32))
    assert set(load_file(out / HEADS_FILE)) == set(model.head_state_dict())


def test_etc_command_writes_a_loadable_folder(tmp_path, capsys):
    from transformers import AutoTokenizer

    out = tmp_path / "etc"
    assert main(["convert", "etc", "--from", str(PADDING), "--out", str(out),
                 "--long-max-len", "64", "--global-max-len", "8"]) == 0
    assert re.match(r"converted etc model\.ckpt-1000 \(54 variables, 0\.1 MB\) -> .*: encoder, tokenizer, model card "
                    r"\(3 dropped variables: see README.md\) in ", capsys.readouterr().out)
    assert sorted(path.name for path in out.iterdir()) == [
        "README.md", "config.json", "model.safetensors", "model.safetensors.sha256", "tokenizer.json",
        "tokenizer_config.json"]
    assert_equals_etcmodel(GlobalLocalModel.from_pretrained(out), PADDING)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer("W3 w4")["input_ids"] == [7, 13, 14, 8]  # lower-cased; [CLS] w3 w4 [SEP]
    card = (out / "README.md").read_text()
    assert "optimizer state" in card and "`share_qkv_projections` | `true`" in card


def assert_nothing_written(out: Path) -> None:
    assert not out.exists()
    assert not [path for path in out.parent.iterdir() if path.name.startswith(f".{out.name}.")]


@pytest.mark.parametrize("family, fixture, message", [
    ("etc", RUNNING_MEAN, "a BERT-style checkpoint .* not ETC"),
    ("realformer", PADDING, "an ETC checkpoint .* not RealFormer's"),
])
def test_checkpoint_of_the_other_family_exits_2(tmp_path, capsys, family, fixture, message):
    out = tmp_path / "out"
    assert main(["convert", family, "--from", str(fixture), "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("longdoc convert: error: ") and len(error.strip().splitlines()) == 1
    assert re.search(message, error)
    assert_nothing_written(out)


def test_damaged_inputs_exit_2_and_write_nothing(tmp_path, capsys):
    folder = tmp_path / "etc"
    shutil.copytree(PADDING, folder)
    out = tmp_path / "out"
    assert main(["convert", "etc", "--from", str(tmp_path), "--out", str(out)]) == 2
    assert "no TF checkpoint here" in capsys.readouterr().err
    shard = folder / "model.ckpt-1000.data-00000-of-00001"
    shard.write_bytes(shard.read_bytes()[:-64])
    assert main(["convert", "etc", "--from", str(folder), "--out", str(out)]) == 2
    assert "(the shard is truncated)" in capsys.readouterr().err
    assert_nothing_written(out)
    shutil.copy(PADDING / shard.name, shard)
    (folder / "vocab.txt").unlink()
    assert main(["convert", "etc", "--from", str(folder), "--out", str(out)]) == 2
    assert "expected one WordPiece vocabulary (vocab.txt or *vocab*.txt), found: none" in capsys.readouterr().err
    assert_nothing_written(out)
    (folder / "vocab.txt").write_text("[PAD]\n[UNK]\nw1\n[CLS]\nw1\n")
    assert main(["convert", "etc", "--from", str(folder), "--out", str(out)]) == 2
    assert "vocab.txt:5: token 'w1' again (first on line 3)" in capsys.readouterr().err
    assert_nothing_written(out)


def test_config_that_disagrees_with_the_weights_is_named(tmp_path):
    folder = tmp_path / "etc"
    shutil.copytree(PADDING, folder)
    (folder / "etc_config.json").write_text(json.dumps({**padding_config(), "intermediate_size": 48}))
    with pytest.raises(InputError, match=r"feed_forward_layer_0/dense_layers/layer_0/kernel \(32, 64\) give "
                                         r"encoder.layers.0.long_feed_forward.intermediate.weight the shape \(64, 32\), "
                                         r"but the config asks for \(48, 32\)"):
        read_etc(folder, SMALL)


def test_a_converted_etc_folder_starts_task_and_pretraining_models(tmp_path):
    from longdoc.model.pretraining import GlobalLocalForPretraining
    from longdoc.tasks import get_task

    out = tmp_path / "etc"
    assert main(["convert", "etc", "--from", str(FIXTURES / "etc" / "separate_qkv"), "--out", str(out)]) == 0
    encoder = GlobalLocalModel.from_pretrained(out).state_dict()
    assert any("long_queries_global_kv" in name for name in encoder)
    for model in (get_task("hotpotqa").load("model").from_encoder(out), GlobalLocalForPretraining.from_encoder(out)):
        started = model.encoder.state_dict()
        assert started.keys() == encoder.keys()
        for name, value in encoder.items():
            torch.testing.assert_close(started[name], value, atol=0, rtol=0, msg=name)
        assert model.encoder.config.cross_kv_projections and model.encoder.config.separate_global_embedding_norm
