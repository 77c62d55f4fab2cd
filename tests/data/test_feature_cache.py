"""The datasets feature cache: parallel map, one row per window, and a second run reuses the cache."""

import json
import os

import pytest

from longdoc.data.feature_cache import cached_features
from longdoc.data.features import FeatureSettings, build_features
from longdoc.convert.pretrained import default_tokenizer
from longdoc.tasks.hotpotqa.reader import read_examples


@pytest.mark.slow  # two datasets passes over real examples
def test_second_run_reuses_the_cache(shared_data, tmp_path):
    # Six real HotpotQA examples in a temporary file (never copied into the repository).
    records = json.loads((shared_data / "hotpotqa" / "hotpot_dev_distractor_v1.first53.json").read_text())[:6]
    source = tmp_path / "six.json"
    source.write_text(json.dumps(records))
    tokenizer = default_tokenizer()
    settings = FeatureSettings(long_max_len=256, global_max_len=96, stride=32, max_question_len=32)
    cache = tmp_path / "cache"

    first = cached_features(read_examples, source, tokenizer, settings, cache, num_proc=2)
    expected = [f.to_dict() for e in read_examples(source) for f in build_features(e, tokenizer, settings)]
    assert len(first) == len(expected) > 6  # 256-token windows: several per example
    assert first[0] == expected[0] and first[-1] == expected[-1]
    files = sorted(f["filename"] for f in first.cache_files)
    assert len(files) == 2  # one Arrow shard per process
    stamps = {name: os.stat(name).st_mtime_ns for name in files}

    second = cached_features(read_examples, source, tokenizer, settings, cache, num_proc=2)
    assert second._fingerprint == first._fingerprint
    assert sorted(f["filename"] for f in second.cache_files) == files
    assert {name: os.stat(name).st_mtime_ns for name in files} == stamps  # not rewritten

    # Other settings: a new fingerprint and new cache files.
    other = cached_features(read_examples, source, tokenizer, FeatureSettings(512, 96, max_question_len=32), cache,
                            num_proc=2)
    assert other._fingerprint != first._fingerprint
