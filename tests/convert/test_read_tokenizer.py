"""read_tokenizer on a longdoc model folder: the saved tokenizer class, without transformers'
warning about the unknown model_type of config.json."""

import logging

import pytest
from transformers.utils import logging as transformers_logging

from longdoc.convert.checkpoint import read_tokenizer
from longdoc.convert.pretrained import default_model_path, default_tokenizer
from longdoc.errors import InputError


def test_a_longdoc_folder_loads_its_tokenizer_class_without_a_model_type_warning(tmp_path, caplog):
    # transformers logs through its own logger, which does not propagate by default.
    transformers_logging.enable_propagation()
    try:
        with caplog.at_level(logging.WARNING):
            tokenizer = read_tokenizer(default_model_path())
    finally:
        transformers_logging.disable_propagation()
    assert type(tokenizer) is type(default_tokenizer())
    assert tokenizer("Hello world")["input_ids"] == default_tokenizer()("Hello world")["input_ids"]
    assert not [record for record in caplog.records if "model of type" in record.getMessage()]


def test_an_unknown_tokenizer_class_is_refused(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "NoSuchTokenizer"}')
    with pytest.raises(InputError, match=r"tokenizer_config.json: tokenizer_class 'NoSuchTokenizer'"):
        read_tokenizer(tmp_path)
