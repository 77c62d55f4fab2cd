"""The parts of longdoc.data.shared_prediction one process can check: batches shared by cost, saved
outputs read back bit for bit, and SharedRowsModel giving each row the outputs of the very batch one
process runs it in, then reusing what a run saved (torchrun's processes: tests/commands/test_predict_torchrun.py)."""

import torch

from longdoc.data.shared_prediction import OutputShards, SharedRowsModel, share_by_cost, shards_folder
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
