"""The parts of longdoc.data.shared_prediction one process can check: examples packed whole, packs
shared by cost, saved outputs read back bit for bit, and SharedRowsModel giving each window the
outputs of the very batch one process runs it in, then reusing what a run saved, and refusing outputs
that are not finite (torchrun's processes: tests/commands/test_predict_torchrun.py)."""

from types import SimpleNamespace

import pytest
import torch
from tqdm.auto import tqdm

from longdoc.data.prediction import ChunkTask, Pack, Progress, score_chunk, example_packs
from longdoc.data.shared_prediction import OutputShards, SharedRowsModel, share_by_cost, shards_folder
from longdoc.errors import InputError
from longdoc.model.task_model import length_batches
from longdoc.distributed import ProcessInfo

ONE_PROCESS = ProcessInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def test_batches_are_shared_dearest_first_to_the_least_loaded_process():
    assert share_by_cost({0: 10, 1: 8, 2: 3, 3: 3, 4: 2}, 2) == [[0, 3], [1, 2, 4]]  # 13 and 13
    assert share_by_cost({0: 5, 1: 5}, 3) == [[0], [1], []]
    assert share_by_cost({}, 2) == [[], []]


def test_saved_outputs_are_read_back_bit_for_bit(tmp_path):
    assert shards_folder(tmp_path / "pred.json") == tmp_path / "pred.json.shards"
    shards = OutputShards(tmp_path)
    outputs = [{"logits": torch.randn(5), "ids": torch.arange(3)}, {"logits": torch.randn(5), "ids": torch.arange(2)}]
    shards.save(3, 7, outputs)
    assert shards.saved(3) == {7} and shards.saved(2) == set()
    for loaded, saved in zip(shards.load(3, 7), outputs):
        assert loaded.keys() == saved.keys()
        assert all(torch.equal(loaded[name], saved[name]) for name in saved)


class BatchRecordingModel:
    """A model whose output for a row says which rows shared its batch (as padding would, in its floats)."""

    config = "the model's own"

    def __init__(self):
        self.rows_run = 0

    def forward_rows(self, rows, collate, batch_size, progress=True, desc="predicting"):
        results = [None] * len(rows)
        for indices in length_batches([len(row["long_input_ids"]) for row in rows], batch_size):
            members = torch.tensor(sorted(rows[i]["number"] for i in indices))
            for i in indices:
                results[i] = {"batch": members}
        self.rows_run += len(rows)
        return results


def test_each_row_gets_the_outputs_of_the_batch_one_process_runs_it_in_then_a_rerun_reuses_them(tmp_path):
    rows = [{"number": n, "long_input_ids": [0] * length} for n, length in enumerate([5, 9, 5, 2, 9, 7, 5, 1])]
    alone = BatchRecordingModel().forward_rows(rows, None, 3)
    model = BatchRecordingModel()
    shared = SharedRowsModel(model, ONE_PROCESS, OutputShards(tmp_path))
    assert shared.config == "the model's own"
    outputs = shared.forward_rows(rows, None, 3, progress=False)
    assert [o["batch"].tolist() for o in outputs] == [o["batch"].tolist() for o in alone]
    assert (shared.windows, shared.reused_windows, model.rows_run) == (8, 0, 8)

    again = BatchRecordingModel()
    rerun = SharedRowsModel(again, ONE_PROCESS, OutputShards(tmp_path))
    reused = rerun.forward_rows(rows, None, 3, progress=False)
    assert [o["batch"].tolist() for o in reused] == [o["batch"].tolist() for o in alone]
    assert (rerun.windows, rerun.reused_windows, again.rows_run) == (8, 8, 0)


def test_examples_are_packed_longest_first_whole_and_costed_by_their_batches():
    lengths = [[5], [9, 9, 3], [2], [7], [9]]
    assert example_packs(lengths, 3) == [Pack((1,), 3, 27), Pack((4, 3, 0), 3, 27), Pack((2,), 1, 2)]
    # An example of more windows than a batch holds is a pack alone, run in two batches (9+9, then 3).
    assert example_packs(lengths, 2) == [Pack((1,), 3, 21), Pack((4, 3), 2, 18), Pack((0, 2), 2, 10)]
    assert example_packs([], 2) == []


def _chunk():
    """Examples of 1 to 3 windows of mixed lengths, and the task that builds and batches them."""
    window_lengths = [[5, 2], [9], [3, 3, 3], [7], [2], [9, 1], [4]]
    chunk = [SimpleNamespace(id=f"example-{e}", lengths=lengths) for e, lengths in enumerate(window_lengths)]
    task = ChunkTask(
        windows=lambda example: [SimpleNamespace(long_input_ids=[0] * length) for length in example.lengths],
        inputs=lambda example, features: {"number": int(example.id.split("-")[1]) * 10 + len(features.long_input_ids),
                                          "long_input_ids": features.long_input_ids},
        collate=None, batch_size=3)
    return chunk, task


def _progress():
    return Progress(tqdm(disable=True))


def test_a_process_of_torchruns_scores_each_window_in_the_batch_one_process_runs_it_in_and_a_rerun_reuses_it(
        tmp_path):
    chunk, task = _chunk()
    alone = BatchRecordingModel()
    expected = score_chunk(alone, chunk, task, _progress())
    # One process runs each example's windows in batches of its pack's examples only.
    for example, windows in expected:
        for window in windows:
            assert {number // 10 for number in window.outputs["batch"].tolist()} <= {
                e for pack in example_packs([c.lengths for c in chunk], 3) if int(example.id[-1]) in pack.examples
                for e in pack.examples}
    model = BatchRecordingModel()
    shared = SharedRowsModel(model, ONE_PROCESS, OutputShards(tmp_path))
    progress = _progress()
    scored = shared.score_chunk(chunk, task, progress)
    assert [example for example, _ in scored] == chunk
    assert [[w.outputs["batch"].tolist() for w in windows] for _, windows in scored] == [
        [w.outputs["batch"].tolist() for w in windows] for _, windows in expected]
    assert (progress.examples, progress.windows) == (7, 11)
    assert (shared.examples, shared.windows, shared.reused_examples, model.rows_run) == (7, 11, 0, 11)

    again = BatchRecordingModel()
    rerun = SharedRowsModel(again, ONE_PROCESS, OutputShards(tmp_path))
    reused = rerun.score_chunk(chunk, task, _progress())
    assert [[w.outputs["batch"].tolist() for w in windows] for _, windows in reused] == [
        [w.outputs["batch"].tolist() for w in windows] for _, windows in expected]
    assert (rerun.reused_examples, rerun.reused_windows, again.rows_run) == (7, 11, 0)


def test_outputs_that_are_not_finite_are_refused_naming_the_example_and_not_saved(tmp_path):
    chunk, task = _chunk()

    class NaNOnExampleThree(BatchRecordingModel):
        def forward_rows(self, rows, collate, batch_size, progress=True, desc="predicting"):
            return [{"logits": torch.tensor([float("nan") if row["number"] // 10 == 3 else 0.0])} for row in rows]

    with pytest.raises(InputError, match="example 'example-3': the model's logits hold NaN"):
        score_chunk(NaNOnExampleThree(), chunk, task, _progress())
    shared = SharedRowsModel(NaNOnExampleThree(), ONE_PROCESS, OutputShards(tmp_path))
    with pytest.raises(InputError, match="example 'example-3': the model's logits hold NaN"):
        shared.score_chunk(chunk, task, _progress())
    pack = next(p for p, pack in enumerate(example_packs([c.lengths for c in chunk], 3)) if 3 in pack.examples)
    assert pack not in OutputShards(tmp_path).saved(0)
