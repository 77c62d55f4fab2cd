"""The parts of longdoc.data.shared_prediction one process can check: examples packed whole, packs
shared by cost, saved outputs read back bit for bit, and SharedRowsModel giving each window the
outputs of the very batch one process runs it in, then reusing what a run saved, and refusing outputs
that are not finite (torchrun's processes: tests/commands/test_predict_torchrun.py)."""

import os
import socket
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp
from tqdm.auto import tqdm

from longdoc.data.prediction import ChunkTask, Pack, Progress, decode_chunk, example_packs
from longdoc.data.shared_prediction import OutputShards, SharedRowsModel, chunk_packs, share_by_cost, shards_folder
from longdoc.errors import InputError
from longdoc.model.task_model import length_batches
from longdoc.distributed import ProcessInfo, start_processes, stop_processes

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
    """A model whose output for a row says which rows shared its batch (as padding would, in its floats),
    and which counts, at each call, the outputs it gave that are still held somewhere."""

    config = "the model's own"

    def __init__(self):
        self.rows_run, self.given, self.most_held = 0, weakref.WeakSet(), 0

    def forward_rows(self, rows, collate, batch_size, progress=True, desc="predicting"):
        self.most_held = max(self.most_held, len(self.given))
        results = [None] * len(rows)
        for indices in length_batches([len(row["long_input_ids"]) for row in rows], batch_size):
            members = torch.tensor(sorted(rows[i]["number"] for i in indices))
            for i in indices:
                results[i] = {"batch": members.clone()}
                self.given.add(results[i]["batch"])
        self.rows_run += len(rows)
        return results


def test_examples_are_packed_longest_first_whole_and_costed_by_their_batches():
    lengths = [[5], [9, 9, 3], [2], [7], [9]]
    assert example_packs(lengths, 3) == [Pack((1,), 3, 27), Pack((4, 3, 0), 3, 27), Pack((2,), 1, 2)]
    # An example of more windows than a batch holds is a pack alone, run in two batches (9+9, then 3).
    assert example_packs(lengths, 2) == [Pack((1,), 3, 21), Pack((4, 3), 2, 18), Pack((0, 2), 2, 10)]
    assert example_packs([], 2) == []
    # Chunk by chunk, as one process reads a streamed file, the examples numbered over the whole set.
    assert chunk_packs(lengths, 3, 2) == [Pack((1,), 3, 27), Pack((0,), 1, 5), Pack((3, 2), 2, 14), Pack((4,), 1, 9)]
    assert chunk_packs(lengths, 3, None) == example_packs(lengths, 3)


WINDOW_LENGTHS = [[5, 2], [9], [3, 3, 3], [7], [2], [9, 1], [4]]


def _examples():
    return [SimpleNamespace(id=f"example-{e}", lengths=lengths) for e, lengths in enumerate(WINDOW_LENGTHS)]


def _decode(example, windows):
    """What a decoder keeps of an example: small values, no window's outputs."""
    return example.id, [w.outputs["batch"].tolist() for w in windows], os.getpid()


def _task(decode=_decode):
    """The task that builds, batches and decodes the examples of `_examples`."""
    return ChunkTask(
        windows=lambda example: [SimpleNamespace(long_input_ids=[0] * length) for length in example.lengths],
        inputs=lambda example, features: {"number": int(example.id.split("-")[1]) * 10 + len(features.long_input_ids),
                                          "long_input_ids": features.long_input_ids},
        collate=None, batch_size=3, decode=decode)


def _progress():
    return Progress(tqdm(disable=True))


def test_a_process_of_torchruns_decodes_each_example_from_the_batch_one_process_runs_it_in_and_a_rerun_reuses_it(
        tmp_path):
    examples, task = _examples(), _task()
    alone = BatchRecordingModel()
    expected = decode_chunk(alone, examples, task, _progress())
    # One process runs each example's windows in batches of its pack's examples only.
    packs = example_packs(WINDOW_LENGTHS, 3)
    for e, (_, batches, _) in enumerate(expected):
        pack = next(pack for pack in packs if e in pack.examples)
        assert {number // 10 for batch in batches for number in batch} <= set(pack.examples)
    model = BatchRecordingModel()
    shared = SharedRowsModel(model, ONE_PROCESS, OutputShards(tmp_path))
    assert shared.config == "the model's own"
    progress = _progress()
    assert shared.decode_examples(lambda: iter(examples), task, None, progress) == expected
    assert (progress.examples, progress.windows) == (7, 11)
    assert (shared.examples, shared.windows, shared.reused_examples, model.rows_run) == (7, 11, 0, 11)

    again = BatchRecordingModel()
    rerun = SharedRowsModel(again, ONE_PROCESS, OutputShards(tmp_path))
    assert rerun.decode_examples(lambda: iter(examples), task, None, _progress()) == expected
    assert (rerun.reused_examples, rerun.reused_windows, again.rows_run) == (7, 11, 0)


def test_no_pack_s_outputs_are_held_once_its_examples_are_decoded(tmp_path):
    """The memory bound: each pack's outputs are let go once its examples are decoded, before the next
    pack runs, in one process and in each of torchrun's (not the chunk's, nor the file's, outputs)."""
    examples, task = _examples(), _task()
    alone = BatchRecordingModel()
    decode_chunk(alone, examples, task, _progress())
    shared = BatchRecordingModel()
    SharedRowsModel(shared, ONE_PROCESS, OutputShards(tmp_path)).decode_examples(lambda: iter(examples), task, None,
                                                                                 _progress())
    assert alone.rows_run == shared.rows_run == 11
    assert alone.most_held == shared.most_held == 0


def test_outputs_that_are_not_finite_are_refused_naming_the_example_and_not_saved(tmp_path):
    examples, task = _examples(), _task(decode=lambda example, windows: example.id)

    class NaNOnExampleThree(BatchRecordingModel):
        def forward_rows(self, rows, collate, batch_size, progress=True, desc="predicting"):
            return [{"logits": torch.tensor([float("nan") if row["number"] // 10 == 3 else 0.0])} for row in rows]

    with pytest.raises(InputError, match="example 'example-3': the model's logits hold NaN"):
        decode_chunk(NaNOnExampleThree(), examples, task, _progress())
    shared = SharedRowsModel(NaNOnExampleThree(), ONE_PROCESS, OutputShards(tmp_path))
    with pytest.raises(InputError, match="example 'example-3': the model's logits hold NaN"):
        shared.decode_examples(lambda: iter(examples), task, None, _progress())
    pack = next(p for p, pack in enumerate(example_packs(WINDOW_LENGTHS, 3)) if 3 in pack.examples)
    assert pack not in OutputShards(tmp_path).saved(0)


def _decode_in_process(rank: int, world_size: int, folder: str, chunk_size, results: str) -> None:
    """One of torchrun's processes (gloo) decoding `_examples` shared out; what it returns and holds, to a file."""
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    processes = start_processes()
    model = BatchRecordingModel()
    shared = SharedRowsModel(model, processes, OutputShards(Path(folder)))
    decoded = shared.decode_examples(lambda: iter(_examples()), _task(), chunk_size, _progress())
    torch.save({"decoded": decoded, "pid": os.getpid(), "most_held": model.most_held, "rows_run": model.rows_run,
                "own": shared.own_windows}, f"{results}-{rank}.pt")
    stop_processes(processes)


@pytest.mark.slow
@pytest.mark.parametrize("chunk_size", [None, 2])
def test_each_process_decodes_its_own_examples_and_the_main_one_receives_only_what_was_decoded(
        tmp_path, monkeypatch, chunk_size):
    """Two processes (gloo): each runs and decodes the examples of its packs and holds no pack's outputs
    past them; the main process receives the decoded examples only, in order, the values one process
    decodes; the packs are shared over the whole set (chunk by chunk, as a streamed file is read, too)."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        monkeypatch.setenv("MASTER_PORT", str(free.getsockname()[1]))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    (tmp_path / "shards").mkdir()
    mp.spawn(_decode_in_process, args=(2, str(tmp_path / "shards"), chunk_size, str(tmp_path / "results")), nprocs=2)
    main, other = (torch.load(tmp_path / f"results-{rank}.pt", weights_only=False) for rank in (0, 1))
    size = chunk_size or len(WINDOW_LENGTHS)
    expected = [decoded for start in range(0, len(WINDOW_LENGTHS), size)
                for decoded in decode_chunk(BatchRecordingModel(), _examples()[start:start + size], _task(), _progress())]
    assert [(e, batches) for e, batches, _ in main["decoded"]] == [(e, batches) for e, batches, _ in expected]
    assert other["decoded"] == []
    decoded_by = {pid for _, _, pid in main["decoded"]}
    assert decoded_by == {main["pid"], other["pid"]}  # the main process decoded only its own share
    assert main["rows_run"] + other["rows_run"] == 11 and main["rows_run"] and other["rows_run"]
    assert main["most_held"] == other["most_held"] == 0
    # Shared by cost over every pack of the set at once, not chunk by chunk.
    packs = chunk_packs(WINDOW_LENGTHS, 3, chunk_size)
    shares = share_by_cost({p: pack.cost for p, pack in enumerate(packs)}, 2)
    assert [main["own"], other["own"]] == [sum(packs[p].windows for p in share) for share in shares]


def test_examples_that_change_between_the_two_readings_are_refused(tmp_path):
    readings = iter([_examples(), _examples()[:5]])
    shared = SharedRowsModel(BatchRecordingModel(), ONE_PROCESS, OutputShards(tmp_path))
    with pytest.raises(InputError, match="gave 7 examples when first read and fewer the second time"):
        shared.decode_examples(lambda: iter(next(readings)), _task(), None, _progress())
