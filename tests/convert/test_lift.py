"""Weight lifting: equivalence with transformers' BERT and RoBERTa, position tiling, fresh tables,
the checkpoint folder the CLI writes, and the errors for checkpoints that are not BERT-like."""

import os
from datetime import datetime, timezone

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer, BertConfig, BertModel, GPT2Config, GPT2Model, RobertaConfig, RobertaForMaskedLM

from longdoc import GlobalLocalConfig, GlobalLocalModel, cli
from longdoc.convert.checkpoint import read_checkpoint
from longdoc.errors import InputError
from longdoc.convert.lift import LiftOptions, lift, lift_model
from longdoc.convert.pretrained import minilm_path

# BERT's own computation, reproduced: absolute positions, no residual scores, no global tokens, and a
# radius that covers the whole input, so every long token attends to every other (full attention).
FULL_ATTENTION = dict(positions="absolute", residual_attention=False, local_radius=512, long_max_len=512, global_max_len=0)


@pytest.fixture(scope="module")
def minilm_pair():
    """(lifted MiniLM, transformers BertModel of the same checkpoint), both in eval mode; lifted once."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    lifted = lift_model(read_checkpoint(minilm_path()), LiftOptions(**FULL_ATTENTION)).model.eval()
    bert = BertModel.from_pretrained(minilm_path(), add_pooling_layer=False).eval()
    return lifted, bert


def random_batch(lengths: list[int], low: int, high: int, pad_id: int, seed: int) -> dict[str, torch.Tensor]:
    """Right-padded ids drawn from [low, high), attention mask and token types for the given lengths."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    ids = torch.where(mask.bool(), torch.randint(low, high, (len(lengths), width), generator=generator), pad_id)
    # Second segment from the middle on, as in a question/passage pair: exercises the type table.
    types = (torch.arange(width)[None, :] >= torch.tensor(lengths)[:, None] // 2).long() * mask
    return {"ids": ids, "mask": mask, "types": types}


# Each forward costs about the same whatever the length (the model pads to one 513-token block), so
# few calls: a short input, the longest, and a padded batch whose rows cover 1 to 512 tokens.
@pytest.mark.parametrize("lengths", [
    pytest.param([7], id="7"),
    pytest.param([512], id="512", marks=pytest.mark.slow),
    pytest.param([512, 300, 17, 1], id="padded-512-300-17-1", marks=pytest.mark.slow),
])
def test_lifted_minilm_equals_bert(minilm_pair, lengths):
    lifted, bert = minilm_pair
    # Ids from 1000 on: ordinary wordpieces, past MiniLM's [unused] and special tokens.
    batch = random_batch(lengths, 1000, bert.config.vocab_size, pad_id=0, seed=lengths[-1])
    with torch.no_grad():
        ours = lifted(batch["ids"], long_attention_mask=batch["mask"], long_token_type_ids=batch["types"]).long_hidden_state
        theirs = bert(batch["ids"], attention_mask=batch["mask"], token_type_ids=batch["types"]).last_hidden_state
    real = batch["mask"].bool()
    # Padding positions carry no meaning in either model; the contract is on real tokens.
    assert (ours - theirs)[real].abs().max().item() < 1e-4


def tiny_roberta(tmp_path):
    """A randomly initialised RoBERTa with an LM head (weights under "roberta."), saved as safetensors.

    max_position_embeddings 40 with pad id 1: real tokens use rows 2..39, i.e. 38 usable positions."""
    torch.manual_seed(1)
    config = RobertaConfig(
        vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
        max_position_embeddings=40, type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5,
    )
    model = RobertaForMaskedLM(config).eval()
    folder = tmp_path / "roberta"
    model.save_pretrained(folder)
    return folder, model.roberta


def test_roberta_family_mapping_with_position_offset(tmp_path):
    folder, roberta = tiny_roberta(tmp_path)
    checkpoint = read_checkpoint(folder)
    assert checkpoint.position_offset == 2 and checkpoint.usable_positions == 38
    assert any(name.startswith("lm_head.") for name in checkpoint.unused)
    options = LiftOptions(positions="absolute", residual_attention=False, local_radius=38, long_max_len=38,
                          global_max_len=0)
    lifted = lift_model(checkpoint, options).model.eval()
    lengths = [38, 20, 3]
    batch = random_batch(lengths, 3, 120, pad_id=1, seed=5)
    with torch.no_grad():
        ours = lifted(batch["ids"], long_attention_mask=batch["mask"]).long_hidden_state
        # RoBERTa derives position ids from the pad id: real tokens get 2, 3, ..., matching our 0, 1, ...
        theirs = roberta(batch["ids"], attention_mask=batch["mask"]).last_hidden_state
    real = batch["mask"].bool()
    assert (ours - theirs)[real].abs().max().item() < 1e-4


def test_positions_tiled_to_long_length(tmp_path):
    folder, roberta = tiny_roberta(tmp_path)
    options = LiftOptions(positions="both", local_radius=8, long_max_len=100, global_max_len=4)
    model = lift_model(read_checkpoint(folder), options).model
    table = model.embeddings.position_embeddings.weight
    source = roberta.embeddings.position_embeddings.weight
    assert table.shape == (100, 32)
    # Longformer's copy rule with RoBERTa's offset: position i reads source row 2 + (i mod 38);
    # e.g. position 0 -> row 2, 37 -> row 39, 38 -> row 2 again, 99 -> row 2 + 23 = 25.
    for position, row in [(0, 2), (37, 39), (38, 2), (75, 39), (76, 2), (99, 25)]:
        torch.testing.assert_close(table[position], source[row], rtol=0, atol=0)
    # "both" keeps relative tables too, freshly drawn at the initializer's scale, and they take part:
    # redrawing them at scale 1 changes the output (unused tables would leave it bit-identical; the
    # change is small only because this random RoBERTa's values are small).
    relative = {name: p for name, p in model.named_parameters() if "relative" in name}
    assert len(relative) == 4 * model.config.num_hidden_layers
    assert all(0.5 < p.std().item() / model.config.initializer_range < 2 for p in relative.values())
    ids = torch.randint(3, 120, (1, 30), generator=torch.Generator().manual_seed(0))
    model.eval()
    with torch.no_grad():
        before = model(ids).long_hidden_state
        torch.manual_seed(0)
        for parameter in relative.values():
            parameter.normal_(0.0, 1.0)
        after = model(ids).long_hidden_state
    assert (before - after).abs().max() > 1e-3


def test_qkv_fused_and_copied_into_both_streams_or_once_when_shared(tmp_path):
    folder, roberta = tiny_roberta(tmp_path)
    checkpoint = read_checkpoint(folder)
    bert_layer = roberta.encoder.layer[1]
    expected_qkv = torch.cat([bert_layer.attention.self.query.weight, bert_layer.attention.self.key.weight,
                              bert_layer.attention.self.value.weight])

    separate = lift_model(checkpoint, LiftOptions(local_radius=4, long_max_len=64, global_max_len=8)).model
    attention = separate.encoder.layers[1].attention
    torch.testing.assert_close(attention.long_qkv.weight, expected_qkv, rtol=0, atol=0)
    torch.testing.assert_close(attention.global_qkv.weight, expected_qkv, rtol=0, atol=0)
    torch.testing.assert_close(separate.encoder.layers[1].global_feed_forward.output.weight,
                               bert_layer.output.dense.weight, rtol=0, atol=0)

    shared = lift_model(checkpoint, LiftOptions(local_radius=4, long_max_len=64, global_max_len=8, share_qkv=True,
                                                share_feed_forward=True, talking_heads=True)).model
    attention = shared.encoder.layers[1].attention
    assert attention.global_qkv is None and shared.encoder.layers[1].global_feed_forward is None
    torch.testing.assert_close(attention.long_qkv.weight, expected_qkv, rtol=0, atol=0)
    # Talking heads have no BERT counterpart: left at their identity initialisation (4 heads).
    torch.testing.assert_close(attention.global_softmax.talking_heads_post.detach(), torch.eye(4), rtol=0, atol=0)


def save_tiny_bert(folder):
    torch.manual_seed(2)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=24, max_position_embeddings=32)
    BertModel(config).save_pretrained(folder)
    return folder


def test_missing_weight_is_named(tmp_path):
    folder = save_tiny_bert(tmp_path / "bert")
    weights = load_file(folder / "model.safetensors")
    del weights["encoder.layer.1.attention.self.key.weight"]
    save_file(weights, folder / "model.safetensors")
    with pytest.raises(InputError, match=r"missing weights encoder\.layer\.1\.attention\.self\.key\.weight"):
        read_checkpoint(folder)


def test_non_bert_config_names_what_is_missing(tmp_path):
    GPT2Model(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=50, n_positions=32)).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(InputError, match=r"model_type 'gpt2' is not BERT-like.*lacks the BERT fields.*hidden_size"):
        read_checkpoint(tmp_path / "gpt2")


def test_pickle_weights_are_refused_without_being_read(tmp_path):
    folder = save_tiny_bert(tmp_path / "bert")
    (folder / "model.safetensors").unlink()
    # Not a pickle at all: had the file been unpickled, the error would be an unpickling error.
    (folder / "pytorch_model.bin").write_bytes(b"not a pickle")
    with pytest.raises(InputError, match=r"only pytorch_model\.bin found.*Convert it once"):
        read_checkpoint(folder)


def run_cli(monkeypatch, *arguments: str) -> int:
    # Only this command is registered, so the test does not depend on the other subcommands.
    monkeypatch.setattr(cli, "COMMANDS", {"lift": "longdoc.commands.lift"})
    return cli.main(["lift", *map(str, arguments)])


@pytest.mark.slow  # lifts and saves the real MiniLM
def test_cli_writes_loadable_checkpoint_with_model_card(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "lifted"
    assert run_cli(monkeypatch, "--from", minilm_path(), "--out", out) == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == ["lifted"]  # no temporary folder left behind

    model = GlobalLocalModel.from_pretrained(out)
    config = model.config
    # ETC-base defaults, MiniLM shapes.
    assert (config.local_radius, config.long_max_len, config.global_max_len) == (84, 4096, 256)
    assert (config.position_embedding_type, config.max_relative_distance, config.residual_attention) == ("relative", 12, True)
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (384, 6, 30522)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.model_max_length == 4096
    assert tokenizer("long documents")["input_ids"] == AutoTokenizer.from_pretrained(minilm_path())("long documents")["input_ids"]

    card = (out / "README.md").read_text(encoding="utf-8")
    assert str(minilm_path()) in card
    assert "| `positions` | `relative` |" in card and "| `local_radius` | `84` |" in card
    assert datetime.now(timezone.utc).strftime("%Y-%m-%d") in card

    # --positions relative: no position table; the relative tables are exactly GlobalLocalModel's own
    # initialisation under the lift seed (0), and copied weights are the source's.
    state = model.state_dict()
    assert "embeddings.position_embeddings.weight" not in state
    torch.manual_seed(0)
    fresh = GlobalLocalModel(GlobalLocalConfig(**{**config.to_dict(), "architectures": None}))
    for name in ("long_softmax.relative_key", "long_softmax.relative_bias", "global_softmax.relative_key",
                 "global_softmax.relative_bias"):
        key = f"encoder.layers.3.attention.{name}"
        torch.testing.assert_close(state[key], fresh.state_dict()[key], rtol=0, atol=0)
        assert 0.015 < state[key].std().item() < 0.025  # drawn from N(0, initializer_range = 0.02)
    source = load_file(minilm_path() / "model.safetensors")
    torch.testing.assert_close(state["encoder.layers.5.global_output_norm.weight"],
                               source["encoder.layer.5.output.LayerNorm.weight"], rtol=0, atol=0)

    # The lifted model runs with global tokens.
    with torch.no_grad():
        output = model.eval()(torch.tensor([[101, 2146, 5491, 102]]), global_input_ids=torch.tensor([[101, 1]]),
                              sentence_ids=torch.tensor([[0, 1, 1, 1]]))
    assert output.global_hidden_state.shape == (1, 2, 384)


def test_cli_errors_exit_2_with_a_message(tmp_path, monkeypatch, capsys):
    GPT2Model(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=50, n_positions=32)).save_pretrained(tmp_path / "gpt2")
    assert run_cli(monkeypatch, "--from", tmp_path / "gpt2", "--out", tmp_path / "out") == 2
    assert "model_type 'gpt2' is not BERT-like" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()

    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    assert run_cli(monkeypatch, "--from", minilm_path(), "--out", tmp_path / "taken") == 2
    assert "already exists" in capsys.readouterr().err


def test_lift_refuses_a_source_without_tokenizer(tmp_path):
    folder = save_tiny_bert(tmp_path / "bert")
    with pytest.raises(InputError, match="no tokenizer files"):
        lift(str(folder), tmp_path / "out", LiftOptions(local_radius=4, long_max_len=64, global_max_len=8))
    assert not (tmp_path / "out").exists()
