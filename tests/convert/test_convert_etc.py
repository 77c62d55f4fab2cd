"""`longdoc convert etc|realformer` on tiny checkpoints written by Google's own model code
(tests/fixtures/tf_checkpoint/make_google_fixtures.py): every variable accounted for, outputs equal
to Google's on the fixture's batch, config fields mapped or refused, bad input refused with exit 2
and nothing written."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from longdoc import cli
from longdoc.cli import main
from longdoc.convert.etc import LengthOptions, etc_config_to_longdoc, read_etc
from longdoc.convert.realformer import realformer_config_to_longdoc
from longdoc.convert.tf_checkpoint import TFCheckpoint
from longdoc.errors import InputError
from longdoc.model.modeling import GlobalLocalModel

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tf_checkpoint"
SMALL = LengthOptions(long_max_len=64, global_max_len=8)
OPTIMIZER_DROPS = {"etc_document_bert/token_emb_lookup/embedding_table/lamb_m", "global_step"}


@pytest.fixture(autouse=True)
def only_the_convert_command(monkeypatch):
    # The parser imports every command module it lists; these tests need one.
    monkeypatch.setattr(cli, "COMMANDS", {"convert": "longdoc.commands.convert"})


# Ties: per layer (2) key and value (2), kernel and bias (2): l2g = g2g and g2l = l2l for separate
# projections (2 each), l2l = g2g under share_kv_projections (1).
@pytest.mark.parametrize("name, tied", [("etc_shared", 0), ("etc_separate_tied", 2 * 2 * 2 * 2),
                                        ("etc_share_kv_tied", 2 * 2 * 2)])
def test_every_etc_variable_is_read_tied_or_dropped(name, tied):
    converted = read_etc(FIXTURES / name, SMALL)
    conversion = converted.conversion
    accounted = set(conversion.read) | {tie.dropped for tie in conversion.tied} | set(conversion.dropped)
    assert accounted == set(converted.checkpoint.entries)
    assert set(conversion.dropped) == OPTIMIZER_DROPS
    assert len(conversion.tied) == tied
    # Every parameter of the model came from the checkpoint.
    assert set(conversion.state) == set(converted.model.state_dict())


def etc_outputs(model: GlobalLocalModel, reference) -> tuple[np.ndarray, np.ndarray]:
    tensor = lambda name: torch.tensor(reference[name], dtype=torch.long)  # noqa: E731
    long_mask = tensor("long_attention_mask")
    with torch.no_grad():
        output = model.eval()(
            long_input_ids=tensor("long_input_ids"), global_input_ids=tensor("global_input_ids"),
            long_attention_mask=long_mask, global_attention_mask=tensor("global_attention_mask"),
            # etcmodel's defaults: long tokens of segment 1, global tokens of segment 0.
            long_token_type_ids=torch.ones_like(long_mask),
            global_token_type_ids=torch.zeros_like(tensor("global_input_ids")),
            sentence_ids=torch.where(long_mask.bool(), tensor("sentence_ids"), -1),
        )
    return output.long_hidden_state.numpy(), output.global_hidden_state.numpy()


@pytest.mark.parametrize("kernels", ["1", "0"])
@pytest.mark.parametrize("name", ["etc_shared", "etc_hard_l2g", "etc_separate_tied", "etc_share_kv_tied"])
def test_converted_etc_equals_etcmodel(name, kernels, monkeypatch):
    monkeypatch.setenv("LONGDOC_KERNELS", kernels)
    reference = np.load(FIXTURES / name / "reference.npz")
    long_output, global_output = etc_outputs(read_etc(FIXTURES / name, SMALL).model, reference)
    long_valid = reference["long_attention_mask"].astype(bool)
    global_valid = reference["global_attention_mask"].astype(bool)
    np.testing.assert_allclose(long_output[long_valid], reference["long_output"][long_valid], atol=1e-5, rtol=0)
    np.testing.assert_allclose(global_output[global_valid], reference["global_output"][global_valid], atol=1e-5, rtol=0)


def test_separate_projections_that_differ_are_refused():
    with pytest.raises(InputError, match=r"l2g_key_projection/linear/kernel differs from .*g2g_key_projection/linear/"
                                         r"kernel, and longdoc projects global tokens with one projection"):
        read_etc(FIXTURES / "etc_separate", SMALL)


def test_variable_nothing_reads_is_named(monkeypatch):
    original = TFCheckpoint.__init__

    def with_extra_variable(self, prefix):
        original(self, prefix)
        self.entries["etc_document_bert/cpc/mystery_head"] = self.entries["global_step"]

    monkeypatch.setattr(TFCheckpoint, "__init__", with_extra_variable)
    with pytest.raises(InputError, match=r"variables that no rule of the ETC converter reads: etc_document_bert/cpc/mystery_head"):
        read_etc(FIXTURES / "etc_shared", SMALL)


def test_missing_variable_is_named(monkeypatch):
    original = TFCheckpoint.__init__
    missing = "etc_document_bert/global_local_transformer_layers/fused_att_layer_1/layer_norm_1/beta"

    def without(self, prefix):
        original(self, prefix)
        del self.entries[missing]

    monkeypatch.setattr(TFCheckpoint, "__init__", without)
    with pytest.raises(InputError, match=rf"not ETC with this config: lacks {missing}"):
        read_etc(FIXTURES / "etc_shared", SMALL)


def shared_config() -> dict:
    return json.loads((FIXTURES / "etc_shared" / "etc_config.json").read_text())


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
    source = {**shared_config(), field: value}
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
    # share_kv_projections is ignored by etcmodel when share_qkv_projections is on.
    assert etc_config_to_longdoc({**source, "share_kv_projections": True}, Path("c"), SMALL).share_qkv


def test_realformer_config_refused_by_name():
    source = json.loads((FIXTURES / "realformer" / "bert_config.json").read_text())
    config = realformer_config_to_longdoc(source, Path("bert_config.json"))
    assert (config.residual_attention, config.residual_attention_mean, config.global_max_len) == (True, True, 0)
    assert config.local_radius >= config.long_max_len == config.max_position_embeddings == 24
    with pytest.raises(InputError, match=r"bert_config.json: unknown field\(s\) embedding_size"):
        realformer_config_to_longdoc({**source, "embedding_size": 8}, Path("bert_config.json"))
    with pytest.raises(InputError, match=r'bert_config.json: hidden_act = "swish" cannot be converted'):
        realformer_config_to_longdoc({**source, "hidden_act": "swish"}, Path("bert_config.json"))


@pytest.mark.parametrize("kernels", ["1", "0"])
def test_realformer_command_output_equals_realformer(tmp_path, kernels, monkeypatch, capsys):
    monkeypatch.setenv("LONGDOC_KERNELS", kernels)
    out = tmp_path / "realformer"
    assert main(["convert", "realformer", "--from", str(FIXTURES / "realformer"), "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["pretraining_heads"] == ["cpc_projection.bias", "cpc_projection.weight", "mlm_bias",
                                            "mlm_transform.dense.bias", "mlm_transform.dense.weight",
                                            "mlm_transform.layer_norm.bias", "mlm_transform.layer_norm.weight"]
    assert set(summary["dropped"]) == {
        "bert/pooler/dense/kernel", "bert/pooler/dense/bias", "cls/seq_relationship/output_weights",
        "cls/seq_relationship/output_bias", "bert/embeddings/word_embeddings/lamb_m", "global_step"}
    reference = np.load(FIXTURES / "realformer" / "reference.npz")
    model = GlobalLocalModel.from_pretrained(out).eval()
    with torch.no_grad():
        output = model(**{name: torch.tensor(reference[name], dtype=torch.long)
                          for name in ("long_input_ids", "long_attention_mask", "long_token_type_ids")})
    valid = reference["long_attention_mask"].astype(bool)
    np.testing.assert_allclose(output.long_hidden_state.numpy()[valid], reference["long_output"][valid], atol=1e-5, rtol=0)


def test_realformer_mlm_head_is_what_pretraining_reads(tmp_path):
    from safetensors.torch import load_file

    from longdoc.model.pretraining import HEADS_FILE, GlobalLocalForPretraining

    out = tmp_path / "realformer"
    # --from may name the checkpoint's prefix instead of its folder.
    assert main(["convert", "realformer", "--from", str(FIXTURES / "realformer" / "model.ckpt-3"), "--out", str(out)]) == 0
    model = GlobalLocalForPretraining.from_encoder(out)
    checkpoint = TFCheckpoint(FIXTURES / "realformer" / "model.ckpt-3")
    np.testing.assert_array_equal(model.mlm_bias.detach().numpy(), checkpoint.read("cls/predictions/output_bias"))
    np.testing.assert_array_equal(model.mlm_transform.dense.weight.detach().numpy(),
                                  checkpoint.read("cls/predictions/transform/dense/kernel").T)
    np.testing.assert_array_equal(model.cpc_projection.weight.detach().numpy(), np.eye(16, dtype=np.float32))
    assert set(load_file(out / HEADS_FILE)) == set(model.head_state_dict())


def test_etc_command_writes_a_loadable_folder(tmp_path, capsys):
    from transformers import AutoTokenizer

    out = tmp_path / "etc"
    assert main(["convert", "etc", "--from", str(FIXTURES / "etc_shared"), "--out", str(out),
                 "--long-max-len", "64", "--global-max-len", "8"]) == 0
    assert "converted etc model.ckpt-3 (54 variables" in capsys.readouterr().out
    assert sorted(path.name for path in out.iterdir()) == [
        "README.md", "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    model = GlobalLocalModel.from_pretrained(out)
    reference = np.load(FIXTURES / "etc_shared" / "reference.npz")
    long_output, _ = etc_outputs(model, reference)
    valid = reference["long_attention_mask"].astype(bool)
    np.testing.assert_allclose(long_output[valid], reference["long_output"][valid], atol=1e-5, rtol=0)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer("W3 w4")["input_ids"] == [2, 8, 9, 3]  # lower-cased; [CLS] w3 w4 [SEP]
    card = (out / "README.md").read_text()
    assert "optimizer state" in card


def assert_nothing_written(out: Path) -> None:
    assert not out.exists()
    assert not [path for path in out.parent.iterdir() if path.name.startswith(f".{out.name}.")]


@pytest.mark.parametrize("family, fixture, message", [
    ("etc", "realformer", "a BERT-style checkpoint .* not ETC"),
    ("realformer", "etc_shared", "an ETC checkpoint .* not RealFormer's"),
    ("etc", "etc_separate", "differs from"),
])
def test_wrong_or_unconvertible_checkpoint_exits_2(tmp_path, capsys, family, fixture, message):
    out = tmp_path / "out"
    assert main(["convert", family, "--from", str(FIXTURES / fixture), "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("longdoc convert: error: ") and len(error.strip().splitlines()) == 1
    assert __import__("re").search(message, error)
    assert_nothing_written(out)


def test_damaged_inputs_exit_2_and_write_nothing(tmp_path, capsys):
    folder = tmp_path / "etc"
    shutil.copytree(FIXTURES / "etc_shared", folder)
    out = tmp_path / "out"
    assert main(["convert", "etc", "--from", str(tmp_path), "--out", str(out)]) == 2
    assert "no TF checkpoint here" in capsys.readouterr().err
    shard = folder / "model.ckpt-3.data-00000-of-00001"
    shard.write_bytes(shard.read_bytes()[:-64])
    assert main(["convert", "etc", "--from", str(folder), "--out", str(out)]) == 2
    assert "(the shard is truncated)" in capsys.readouterr().err
    assert_nothing_written(out)
    shutil.copy(FIXTURES / "etc_shared" / shard.name, shard)
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
    shutil.copytree(FIXTURES / "etc_shared", folder)
    (folder / "etc_config.json").write_text(json.dumps({**shared_config(), "intermediate_size": 48}))
    with pytest.raises(InputError, match=r"feed_forward_layer_0/dense_layers/layer_0/kernel \(16, 32\) give "
                                         r"encoder.layers.0.long_feed_forward.intermediate.weight the shape \(32, 16\), "
                                         r"but the config asks for \(48, 16\)"):
        read_etc(folder, SMALL)


# The fixtures written by scripts/make_etc_reference.py with Google's etcmodel: random weights away
# from their initial values, both embedding norms different, one example per row.
GOOGLE_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "etc"
ONE_EXAMPLE_PER_ROW = ["padding", "fewer_globals", "hard_g2l", "hard_l2g", "radius_1", "radius_7", "max_distance_1",
                       "max_distance_12", "separate_feed_forward_shared_output"]


@pytest.mark.parametrize("kernels", ["1", "0"])
@pytest.mark.parametrize("name", ONE_EXAMPLE_PER_ROW)
def test_converted_etc_equals_etcmodel_on_googles_fixtures(name, kernels, monkeypatch):
    monkeypatch.setenv("LONGDOC_KERNELS", kernels)
    inputs, outputs = (np.load(GOOGLE_FIXTURES / name / f"{part}.npz") for part in ("inputs", "outputs"))
    model = read_etc(GOOGLE_FIXTURES / name, SMALL).model.eval()
    tensor = lambda array: torch.tensor(array, dtype=torch.long)  # noqa: E731
    long_valid, global_valid = outputs["long_valid"].astype(bool), outputs["global_valid"].astype(bool)
    with torch.no_grad():
        output = model(long_input_ids=tensor(inputs["token_ids"]), global_input_ids=tensor(inputs["global_token_ids"]),
                       long_attention_mask=tensor(long_valid), global_attention_mask=tensor(global_valid),
                       long_token_type_ids=tensor(inputs["segment_ids"]),
                       global_token_type_ids=tensor(inputs["global_segment_ids"]),
                       sentence_ids=torch.where(tensor(long_valid).bool(), tensor(inputs["sentence_ids"]), -1))
    np.testing.assert_allclose(output.long_hidden_state.numpy()[long_valid], outputs["long_output"][long_valid],
                               atol=1e-4, rtol=0)
    np.testing.assert_allclose(output.global_hidden_state.numpy()[global_valid],
                               outputs["global_output"][global_valid], atol=1e-4, rtol=0)
