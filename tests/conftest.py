"""Shared fixtures: a small embedded corpus built with the real TFDS builder, and its tokenizer."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")  # fake CPU devices

import pytest  # noqa: E402

from fxformer import cli  # noqa: E402
from fxformer.data import corpora, tokenizer_for  # noqa: E402


def small_config(data_dir, **data_overrides):
    """configs/default.py shrunk for tests, reading and writing TFDS data under `data_dir`."""
    config = cli.load_config("configs/default.py")
    config.data.tfds_data_dir = str(data_dir)
    config.data.num_train, config.data.num_validation, config.data.num_test = 3000, 100, 100
    config.data.vocab_size = 400
    config.data.tokenizer_sentences = 6000
    config.data.max_length = 32
    config.data.tokens_per_batch = 256
    for key, value in data_overrides.items():
        config.data[key] = value
    return config


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tfds")


@pytest.fixture(scope="session")
def corpus(data_dir):
    """(config, builder, tokenizer) for a 3000-pair embedded corpus."""
    config = small_config(data_dir)
    builder = corpora.prepare(config.data)
    return config, builder, tokenizer_for(config.data, builder)
