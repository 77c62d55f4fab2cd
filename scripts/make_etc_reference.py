"""Reference fixtures from Google's own ETC and RealFormer code (tests/fixtures/README.md).

  python scripts/make_etc_reference.py --google-research DIR [--out tests/fixtures] [--cases NAME ...]
      every small case (or the named ones) into OUT/etc/CASE/ and OUT/realformer/CASE/.
  python scripts/make_etc_reference.py --google-research DIR --full-size OUT_DIR [--full-length 4096]
      a random checkpoint with etc_base's shapes and variable names, and etcmodel's outputs on one
      document of that many long tokens (about 0.5 GB; not for the repository).

DIR is a checkout of google-research/google-research (its etcmodel/ and realformer/ folders are
imported from it). This script needs TensorFlow 2 with tf-keras (etcmodel runs on legacy Keras:
TF_USE_LEGACY_KERAS=1, set here before TensorFlow is imported), tf-slim (RealFormer) and attrs;
neither the tests nor CI run it, and nothing in longdoc imports TensorFlow.

Each case directory holds what a converter and a test need, and nothing pickled:
  model.ckpt-STEP.index, model.ckpt-STEP.data-00000-of-00001  TF1 checkpoint, variable names exactly
      as etcmodel's EtcModel (realformer's BertModel) creates them, plus `global_step`; every
      weight random and away from its initial value (norms, biases and relative tables included);
      A pretraining run's leftovers come along, as in a released checkpoint: the optimizer's slots
      of one variable (LAMB's for ETC, Adam's for RealFormer) and, for RealFormer, BERT's
      pretraining heads (cls/predictions, cls/seq_relationship);
  etc_config.json (bert_config.json)  the model's config, in the released checkpoints' format;
  vocab.txt        a WordPiece vocabulary of the config's size (BERT's special tokens and words);
  structure.json   the raw structure the inputs were built from (token ids per sentence, per
      packed example, per row) and the case's description;
  inputs.npz       the inputs etcmodel received: ids, token types, example ids, sentence ids, and
      the masks and relative ids etcmodel's own input code built from them;
  outputs.npz      etcmodel's long and global outputs (RealFormer: the sequence output) and the
      masks of the positions where they are meaningful (real tokens).
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINT_STEP = 1000
# Ids the released ETC checkpoints were pretrained with (etcmodel/models/hotpotqa/
# generate_tf_examples_lib.py, WORDPIECE_DEFAULT_GLOBAL_TOKEN_IDS: "used in pretraining"): one
# global token per sentence with id 1 ([unused0]); 2 ([unused1]) is CPC's masked sentence token.
SENTENCE_GLOBAL_TOKEN_ID = 1
CPC_MASK_GLOBAL_TOKEN_ID = 2
# EtcModel.call's defaults when no token types are given: 1 for long tokens, 0 for global ones.
LONG_TOKEN_TYPE = 1
GLOBAL_TOKEN_TYPE = 0

SMALL_ETC_CONFIG = dict(
    vocab_size=64, segment_vocab_size=16, embedding_size=None, hidden_size=32, num_hidden_layers=2,
    num_attention_heads=4, local_radius=3, att_size_per_head=None, relative_pos_max_distance=4,
    relative_vocab_size=12, max_absolute_position_embeddings=0, intermediate_size=64, hidden_act="gelu",
    hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, initializer_range=0.02,
    share_feed_forward_params=True, share_kv_projections=False, share_qkv_projections=True,
    share_att_output_projection=False, use_pre_activation_order=False, use_hard_g2l_mask=False,
    use_hard_l2g_mask=False, grad_checkpointing_period=0,
)
SMALL_REALFORMER_CONFIG = dict(
    vocab_size=64, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
    hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, max_position_embeddings=16,
    type_vocab_size=2, initializer_range=0.02, use_running_mean=False,
)
# etc_base: the ETC paper's base shapes (EtcConfig's defaults: 12 layers, hidden 768, radius 84,
# relative distance 12 over a vocabulary of 32, shared Q/K/V and feed-forward).
ETC_BASE_CONFIG = {**SMALL_ETC_CONFIG, **dict(
    vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, local_radius=84,
    relative_pos_max_distance=12, relative_vocab_size=32, intermediate_size=3072,
)}


def sentences(rng, lengths, vocab_size, global_id=SENTENCE_GLOBAL_TOKEN_ID, long_type=LONG_TOKEN_TYPE,
              global_type=GLOBAL_TOKEN_TYPE):
    """Sentences of the given lengths with random token ids (never 0, the padding id)."""
    return [dict(token_ids=[int(t) for t in rng.integers(3, vocab_size, n)], global_token_id=global_id,
                 long_token_type=long_type, global_token_type=global_type) for n in lengths]


def etc_cases():
    """name -> (config overrides, row builder(rng, vocab) -> rows, long length, global length, what)."""
    def one_example_per_row(*rows_of_lengths):
        return lambda rng, vocab: [[dict(sentences=sentences(rng, lengths, vocab))] for lengths in rows_of_lengths]

    def padding_rows(rng, vocab):
        # Row 0 fills the long input; row 1 is shorter (long padding) and, with fewer sentences,
        # has fewer global tokens (global padding); its second sentence uses other ids and types.
        return [
            [dict(sentences=sentences(rng, [5, 7, 4, 8], vocab))],
            [dict(sentences=sentences(rng, [6], vocab) + sentences(rng, [9], vocab, global_id=CPC_MASK_GLOBAL_TOKEN_ID,
                                                                    long_type=2, global_type=3))],
        ]

    def packed_rows(rng, vocab):
        # Several examples packed into one row, as ETC's pretraining packs documents; row 1 is a
        # single example with padding.
        return [
            [dict(sentences=sentences(rng, [4, 3], vocab)), dict(sentences=sentences(rng, [6], vocab)),
             dict(sentences=sentences(rng, [2, 5, 3], vocab))],
            [dict(sentences=sentences(rng, [7, 6], vocab))],
        ]

    return {
        "padding": ({}, padding_rows, 24, 4,
                    "batch of 2: row 1 has long and global padding (fewer global tokens) and other "
                    "global ids / token types in one sentence; shared Q/K/V"),
        "fewer_globals": ({}, one_example_per_row([3, 2, 4, 3, 2, 5], [10, 9]), 20, 6,
                          "row 0 has 6 global tokens, row 1 has 2 (4 global padding slots)"),
        "packed": ({}, packed_rows, 26, 6,
                   "3 examples packed into row 0 (long/global example ids 3, 2, 1, padding 0): no attention "
                   "across examples"),
        "packed_hard_g2l": (dict(use_hard_g2l_mask=True), packed_rows, 26, 6,
                            "as packed, with use_hard_g2l_mask: a global token sees only its sentence's long tokens"),
        "hard_g2l": (dict(use_hard_g2l_mask=True), padding_rows, 24, 4, "as padding, with use_hard_g2l_mask"),
        "hard_l2g": (dict(use_hard_l2g_mask=True), padding_rows, 24, 4, "as padding, with use_hard_l2g_mask"),
        "radius_1": (dict(local_radius=1), one_example_per_row([6, 5, 4], [8, 3]), 15, 3,
                     "local radius 1, relative max distance 4 (ids past the window unused)"),
        "radius_7": (dict(local_radius=7), one_example_per_row([9, 8, 7, 6], [12, 10]), 30, 4,
                     "local radius 7 > relative max distance 4: clipped ids inside the window"),
        "max_distance_1": (dict(relative_pos_max_distance=1, relative_vocab_size=6, local_radius=4),
                           one_example_per_row([5, 6, 4], [9, 3]), 15, 3,
                           "relative max distance 1 (relative vocabulary 2k+1+3 = 6)"),
        "max_distance_12": (dict(relative_pos_max_distance=12, relative_vocab_size=32, local_radius=14, num_hidden_layers=3),
                            one_example_per_row([10, 12, 9, 11], [20, 14]), 42, 4,
                            "relative max distance 12 with vocabulary 32 (etc_base's), radius 14, 3 layers"),
        "separate_qkv": (dict(share_qkv_projections=False), padding_rows, 24, 4,
                         "share_qkv_projections off: 10 projections per layer (long query, l2l/l2g keys and "
                         "values, global query, g2g/g2l keys and values)"),
        "share_kv": (dict(share_qkv_projections=False, share_kv_projections=True), padding_rows, 24, 4,
                     "share_kv_projections: l2g keys/values are l2l's, g2l keys/values are g2g's"),
        "separate_feed_forward_shared_output": (
            dict(share_feed_forward_params=False, share_att_output_projection=True), padding_rows, 24, 4,
            "share_feed_forward_params off (long and global feed-forward and its norm separate), "
            "share_att_output_projection on"),
    }


def realformer_cases():
    return {
        "padding": (dict(), [[5, 7], [4, 3]], 12,
                    "batch of 2 sentence pairs (token types 0 then 1), row 1 padded"),
        "running_mean": (dict(use_running_mean=True), [[6, 4], [3, 2]], 10,
                         "as padding, with use_running_mean: the carried score sum divided by the layer number"),
    }


def pack_etc_rows(rows, long_length, global_length):
    """ETC's packed layout from the raw structure: per row, examples in order, each sentence's
    tokens on the long input and one global token per sentence; `sentence_ids` is the index of the
    sentence's global token in the row; breakpoints mark each example's last token (as etcmodel's
    pretraining inputs; `make_global_local_transformer_side_inputs` turns them into example ids);
    padding: token id 0, token type 0, sentence id 0, breakpoint 0."""
    batch = len(rows)
    arrays = {name: np.zeros((batch, long_length), np.int32)
              for name in ("token_ids", "segment_ids", "sentence_ids", "long_breakpoints")}
    arrays.update({name: np.zeros((batch, global_length), np.int32)
                   for name in ("global_token_ids", "global_segment_ids", "global_breakpoints")})
    for row, examples in enumerate(rows):
        position = global_position = 0
        for example in examples:
            for sentence in example["sentences"]:
                tokens = sentence["token_ids"]
                end = position + len(tokens)
                if end > long_length or global_position >= global_length:
                    raise ValueError(f"row {row} does not fit {long_length} long / {global_length} global tokens")
                arrays["token_ids"][row, position:end] = tokens
                arrays["segment_ids"][row, position:end] = sentence["long_token_type"]
                arrays["sentence_ids"][row, position:end] = global_position
                arrays["global_token_ids"][row, global_position] = sentence["global_token_id"]
                arrays["global_segment_ids"][row, global_position] = sentence["global_token_type"]
                position, global_position = end, global_position + 1
            arrays["long_breakpoints"][row, position - 1] = 1
            arrays["global_breakpoints"][row, global_position - 1] = 1
    return arrays


def write_vocabulary(directory, size):
    """BERT's layout at a small size: [PAD], the [unusedN] rows global tokens use, [UNK], [CLS],
    [SEP], [MASK], then words."""
    special = ["[PAD]", *(f"[unused{i}]" for i in range(5)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens = special + [f"w{i}" for i in range(size - len(special))]
    (directory / "vocab.txt").write_text("\n".join(tokens) + "\n")


def add_optimizer_slots(tf, variable_name, optimizer):
    """The two moment slots `optimizer` ("lamb" or "adam") keeps for one variable, named as its
    checkpoints name them (VAR/lamb_m, VAR/lamb_v): a converter must drop them."""
    variable = next(v for v in tf.compat.v1.global_variables() if v.op.name == variable_name)
    for moment in ("m", "v"):
        tf.compat.v1.get_variable(f"{variable_name}/{optimizer}_{moment}", variable.shape, trainable=False)


def add_bert_pretraining_heads(tf, realformer, sequence_output, config):
    """BERT's pretraining heads under run_pretraining.py's names: the MLM transform, its LayerNorm
    and output bias, and next-sentence prediction's output layer."""
    hidden = config["hidden_size"]
    with tf.compat.v1.variable_scope("cls/predictions"):
        with tf.compat.v1.variable_scope("transform"):
            transformed = tf.compat.v1.layers.dense(sequence_output, hidden, name="dense")
            realformer.layer_norm(transformed)
        tf.compat.v1.get_variable("output_bias", [config["vocab_size"]])
    with tf.compat.v1.variable_scope("cls/seq_relationship"):
        tf.compat.v1.get_variable("output_weights", [2, hidden])
        tf.compat.v1.get_variable("output_bias", [2])


def random_weights(name, shape, rng):
    """Values for one variable, away from its initial value: layer norm scales around 1 and every
    bias, offset and relative table random, so that a converter that drops or swaps any of them fails."""
    if name.endswith("/gamma"):
        return 1.0 + 0.3 * rng.standard_normal(shape)
    if name.endswith(("/beta", "/bias", "relative_bias_table")):
        return 0.3 * rng.standard_normal(shape)
    if "relative_emb_table" in name:
        return 0.5 * rng.standard_normal(shape)
    if name.endswith(("word_embeddings", "token_type_embeddings", "position_embeddings", "embedding_table")):
        return rng.standard_normal(shape)
    return rng.standard_normal(shape) / np.sqrt(shape[0])  # kernels [in, out]: unit-scale outputs


def randomize_and_save(tf, session, directory, rng):
    """Assign random values to every global variable and save a TF1 checkpoint (index + one data
    shard, no meta graph) under the variables' own names, with `global_step`."""
    global_step = tf.compat.v1.train.get_or_create_global_step()
    variables = tf.compat.v1.global_variables()
    session.run(tf.compat.v1.global_variables_initializer())
    for variable in variables:
        if variable is global_step:
            session.run(variable.assign(CHECKPOINT_STEP))
            continue
        shape = variable.shape.as_list()
        variable.load(random_weights(variable.op.name, shape, rng).astype(np.float32), session)
    saver = tf.compat.v1.train.Saver(var_list={v.op.name: v for v in variables}, sharded=False)
    saver.save(session, str(directory / "model.ckpt"), global_step=CHECKPOINT_STEP, write_meta_graph=False,
               write_state=False)
    return {v.op.name: v.shape.as_list() for v in variables}


def call_etc(model, input_utils, config, tensors):
    """etcmodel's side inputs from breakpoints and sentence ids (its own input code), then the model."""
    side = input_utils.make_global_local_transformer_side_inputs(
        long_breakpoints=tensors["long_breakpoints"], global_breakpoints=tensors["global_breakpoints"],
        sentence_ids=tensors["sentence_ids"], local_radius=config.local_radius,
        relative_pos_max_distance=config.relative_pos_max_distance,
        use_hard_g2l_mask=config.use_hard_g2l_mask, use_hard_l2g_mask=config.use_hard_l2g_mask)
    long_output, global_output = model(
        token_ids=tensors["token_ids"], global_token_ids=tensors["global_token_ids"],
        segment_ids=tensors["segment_ids"], global_segment_ids=tensors["global_segment_ids"], **side.to_dict())
    return side, long_output, global_output


def run_etc_case(tf, modeling, input_utils, directory, config_dict, rows, long_length, global_length, seed,
                 description):
    """Build, randomize, save and run one ETC case; returns the largest difference between
    etcmodel's sparse (blocked) and full attention paths, a check on this run (None past 1024 long
    tokens, where both run the blocked one)."""
    rng = np.random.default_rng(seed)
    arrays = pack_etc_rows(rows, long_length, global_length)
    config = modeling.EtcConfig.from_dict(config_dict)
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session() as session:
        # etcmodel needs the global length statically (feature_utils.RelativePositionGenerator).
        feeds = {name: tf.compat.v1.placeholder(tf.int32, [None, global_length if "global" in name else None], name)
                 for name in arrays}
        model = modeling.EtcModel(config, is_training=False)
        # Unknown long length: etcmodel's blocked ("sparse") attention, the one it runs on long inputs.
        side, long_output, global_output = call_etc(model, input_utils, config, feeds)
        add_optimizer_slots(tf, "etc_document_bert/token_emb_lookup/embedding_table", "lamb")
        # Up to 1024 long tokens, the same inputs with static shapes take its full-attention path:
        # both must agree.
        full_path = long_length <= 1024
        if full_path:
            _, full_long, full_global = call_etc(model, input_utils, config,
                                                 {name: tf.constant(value) for name, value in arrays.items()})
        shapes = randomize_and_save(tf, session, directory, rng)
        feed_dict = {feeds[name]: value for name, value in arrays.items()}
        side_values, long_value, global_value = session.run(
            [side.to_dict(), long_output, global_output], feed_dict)
        if full_path:
            full_long_value, full_global_value = session.run([full_long, full_global])
    long_example_ids = np.cumsum(arrays["long_breakpoints"][:, ::-1], axis=1)[:, ::-1]
    global_example_ids = np.cumsum(arrays["global_breakpoints"][:, ::-1], axis=1)[:, ::-1]
    inputs = dict(
        token_ids=arrays["token_ids"], global_token_ids=arrays["global_token_ids"],
        segment_ids=arrays["segment_ids"], global_segment_ids=arrays["global_segment_ids"],
        sentence_ids=arrays["sentence_ids"], long_breakpoints=arrays["long_breakpoints"],
        global_breakpoints=arrays["global_breakpoints"], long_example_ids=long_example_ids.astype(np.int32),
        global_example_ids=global_example_ids.astype(np.int32),
        **{name: np.asarray(value, np.int32) for name, value in side_values.items()},
    )
    long_valid, global_valid = long_example_ids > 0, global_example_ids > 0
    gap = max(np.abs(full_long_value - long_value)[long_valid].max(),
              np.abs(full_global_value - global_value)[global_valid].max()) if full_path else None
    write_json(directory / "etc_config.json", config_dict)
    write_vocabulary(directory, config_dict["vocab_size"])
    write_json(directory / "structure.json", dict(
        description=description, long_length=long_length, global_length=global_length,
        rows=[dict(examples=examples) for examples in rows],
        layout=("per row, examples in order; per example, sentences in order; each sentence's token_ids go on "
                "the long input with token type long_token_type, and one global token (global_token_id, "
                "global_token_type) per sentence; padding id 0, type 0"),
    ))
    np.savez(directory / "inputs.npz", **inputs)
    np.savez(directory / "outputs.npz", long_output=long_value.astype(np.float32),
             global_output=global_value.astype(np.float32), long_valid=long_valid, global_valid=global_valid)
    write_json(directory / "variables.json", shapes)
    return gap


def run_realformer_case(tf, realformer, directory, config_dict, lengths, seq_length, seed, description):
    rng = np.random.default_rng(seed)
    batch = len(lengths)
    input_ids = np.zeros((batch, seq_length), np.int32)
    input_mask = np.zeros((batch, seq_length), np.int32)
    token_type_ids = np.zeros((batch, seq_length), np.int32)
    raw_rows = []
    for row, segment_lengths in enumerate(lengths):
        position = 0
        segments = []
        for segment, n in enumerate(segment_lengths):
            tokens = [int(t) for t in rng.integers(3, config_dict["vocab_size"], n)]
            input_ids[row, position:position + n] = tokens
            input_mask[row, position:position + n] = 1
            token_type_ids[row, position:position + n] = segment
            segments.append(dict(token_ids=tokens, token_type=segment))
            position += n
        raw_rows.append(dict(segments=segments))
    config = realformer.BertConfig.from_dict(config_dict)
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session() as session:
        ids = tf.compat.v1.placeholder(tf.int32, [batch, seq_length])
        mask = tf.compat.v1.placeholder(tf.int32, [batch, seq_length])
        types = tf.compat.v1.placeholder(tf.int32, [batch, seq_length])
        model = realformer.BertModel(config=config, is_training=False, input_ids=ids, input_mask=mask,
                                     token_type_ids=types)
        add_bert_pretraining_heads(tf, realformer, model.get_sequence_output(), config_dict)
        add_optimizer_slots(tf, "bert/embeddings/word_embeddings", "adam")
        shapes = randomize_and_save(tf, session, directory, rng)
        sequence_output, pooled_output = session.run(
            [model.get_sequence_output(), model.get_pooled_output()],
            {ids: input_ids, mask: input_mask, types: token_type_ids})
    write_json(directory / "bert_config.json", config_dict)
    write_vocabulary(directory, config_dict["vocab_size"])
    write_json(directory / "structure.json", dict(
        description=description, seq_length=seq_length, rows=raw_rows,
        layout="per row, segments in order (token type = segment index), then padding (id 0, mask 0, type 0)"))
    np.savez(directory / "inputs.npz", input_ids=input_ids, input_mask=input_mask, token_type_ids=token_type_ids)
    np.savez(directory / "outputs.npz", sequence_output=sequence_output.astype(np.float32),
             pooled_output=pooled_output.astype(np.float32), valid=input_mask.astype(bool))
    write_json(directory / "variables.json", shapes)


def write_json(path, value):
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")


def import_google_code(checkout):
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for folder in ("etcmodel", "realformer"):
        if not (checkout / folder).is_dir():
            sys.exit(f"make_etc_reference: {checkout} has no {folder}/ folder (expected a google-research checkout)")
    sys.path.insert(0, str(checkout))
    sys.path.insert(0, str(checkout / "realformer"))
    import tensorflow as tf
    from etcmodel.models import input_utils, modeling
    import realformer
    return tf, modeling, input_utils, realformer


def fresh_directory(path):
    path.mkdir(parents=True, exist_ok=True)
    for old in path.iterdir():
        old.unlink()
    return path


def write_full_size(tf, modeling, input_utils, out, length):
    """etc_base's shapes and names, random weights, one document of `length` long tokens in sentences
    of 10-40 tokens (one global token each)."""
    rng = np.random.default_rng(2026)
    lengths = []
    while sum(lengths) < length:
        lengths.append(int(rng.integers(10, 41)))
    lengths[-1] -= sum(lengths) - length
    rows = [[dict(sentences=sentences(rng, lengths, ETC_BASE_CONFIG["vocab_size"]))]]
    started = time.perf_counter()
    run_etc_case(tf, modeling, input_utils, fresh_directory(out), ETC_BASE_CONFIG, rows, length, len(lengths), 7,
                 f"etc_base shapes, one document of {length} long tokens, {len(lengths)} sentences")
    return time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--google-research", type=Path, required=True, help="checkout of google-research")
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures", help="fixtures root")
    parser.add_argument("--cases", nargs="*", help="only these cases (etc/NAME or realformer/NAME)")
    parser.add_argument("--full-size", type=Path, help="write the etc_base-shaped checkpoint and outputs here instead")
    parser.add_argument("--full-length", type=int, default=4096)
    args = parser.parse_args()
    tf, modeling, input_utils, realformer = import_google_code(args.google_research.resolve())
    revision = subprocess.run(["git", "-C", str(args.google_research), "rev-parse", "HEAD"], capture_output=True,
                              text=True).stdout.strip() or "not a git checkout"
    print(f"TensorFlow {tf.__version__}, google-research {revision}")
    if args.full_size:
        seconds = write_full_size(tf, modeling, input_utils, args.full_size, args.full_length)
        size = sum(p.stat().st_size for p in args.full_size.iterdir())
        print(f"full size: {args.full_size} {size / 2**20:.0f} MiB in {seconds:.0f} s")
        return
    wanted = set(args.cases or [])
    for seed, (name, (overrides, build_rows, long_length, global_length, what)) in enumerate(etc_cases().items()):
        if wanted and f"etc/{name}" not in wanted:
            continue
        config = {**SMALL_ETC_CONFIG, **overrides}
        rows = [[{"sentences": e["sentences"]} for e in examples]
                for examples in build_rows(np.random.default_rng(100 + seed), config["vocab_size"])]
        directory = fresh_directory(args.out / "etc" / name)
        gap = run_etc_case(tf, modeling, input_utils, directory, config, rows, long_length, global_length, seed, what)
        size = sum(p.stat().st_size for p in directory.iterdir())
        print(f"etc/{name}: {size / 1024:.0f} KiB, sparse vs full attention max |diff| {gap:.1e}")
        if gap > 1e-5:
            sys.exit(f"etc/{name}: etcmodel's two attention paths differ by {gap}")
    for seed, (name, (overrides, lengths, seq_length, what)) in enumerate(realformer_cases().items()):
        if wanted and f"realformer/{name}" not in wanted:
            continue
        config = {**SMALL_REALFORMER_CONFIG, **overrides}
        directory = fresh_directory(args.out / "realformer" / name)
        run_realformer_case(tf, realformer, directory, config, lengths, seq_length, 50 + seed, what)
        size = sum(p.stat().st_size for p in directory.iterdir())
        print(f"realformer/{name}: {size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
