"""Each decision once: the loop a worker runs (handlers/configuration/placement.py) from what its server
says, TorchServe's keys read in its room alone, and which task an archive serves."""

import dataclasses
from pathlib import Path

import pytest

from ts_compiled_handlers.configuration.config import GENERATION, TASKS, ConfigError
from ts_compiled_handlers.configuration.placement import Loop, LoopError, Placement, loop_of
from ts_compiled_handlers.runtime import package_files
from ts_compiled_handlers.servers.archive import is_stock_handler
from ts_compiled_handlers.servers.torchserve import settings
from ts_compiled_handlers.tasks.registry import TASK_CLASSES

PLACED = Placement(Path("/models/m"), "m", {})


@pytest.mark.parametrize(
    "task, one_at_a_time, continuous, loop",
    [
        ("embedding", False, False, Loop.REQUEST_BATCHES),
        ("embedding", True, False, Loop.SCHEDULED),
        (GENERATION, False, False, Loop.GENERATION_BATCHES),
        (GENERATION, False, True, Loop.DECODE_LOOP),
        (GENERATION, True, True, Loop.DECODE_LOOP),  # a Ray replica: one at a time into the decode loop
    ],
)
def test_one_function_chooses_the_loop_from_what_the_server_says(task, one_at_a_time, continuous, loop):
    placement = dataclasses.replace(PLACED, one_at_a_time=one_at_a_time, continuous=continuous)
    assert loop_of(task, placement) is loop


def test_no_loop_serves_an_encoder_continuously_or_generation_one_at_a_time_without_its_decode_loop():
    with pytest.raises(LoopError, match="decode loop"):
        loop_of("embedding", dataclasses.replace(PLACED, continuous=True))
    with pytest.raises(LoopError, match="one at a time"):
        loop_of(GENERATION, dataclasses.replace(PLACED, one_at_a_time=True))


def test_torchserves_keys_become_the_placements_plain_values_in_its_room():
    yaml_config = {"minWorkers": 3, "asyncCommunication": True, "batchSize": 1}
    placed = settings.placed(dataclasses.replace(PLACED, yaml_config=yaml_config, batch_size=1), "embedding")
    assert (placed.one_at_a_time, placed.continuous, placed.workers) == (True, False, 3)
    generation = settings.read({"continuousBatching": True}, GENERATION)
    assert generation == {"one_at_a_time": False, "continuous": True, "workers": 1}


@pytest.mark.parametrize(
    "yaml_config, task, key",
    [
        ({"continuousBatching": True}, "embedding", "continuousBatching"),
        ({"asyncCommunication": True}, GENERATION, "asyncCommunication"),
        ({"asyncCommunication": True, "batchSize": 4}, "embedding", "batchSize"),
        ({"minWorkers": 0}, "embedding", "minWorkers"),
        ({"continuousBatching": "yes"}, GENERATION, "continuousBatching"),
    ],
)
def test_torchserves_keys_are_refused_with_their_name(yaml_config, task, key):
    with pytest.raises(ConfigError, match=key):
        settings.read(yaml_config, task)


def test_a_registration_batch_size_is_checked_against_async_communication():
    with pytest.raises(ConfigError, match="batchSize=8"):
        settings.read({"asyncCommunication": True}, "embedding", batch_size=8)


def test_every_task_has_one_name_and_one_class_that_agree():
    assert tuple(TASK_CLASSES) == TASKS
    assert all(task.NAME == name for name, task in TASK_CLASSES.items())
    assert [name for name, task in TASK_CLASSES.items() if not task.AOT] == [GENERATION]


def test_our_handler_files_of_any_version_are_told_from_a_users_own(tmp_path):
    assert is_stock_handler(package_files.PACKAGE / package_files.HANDLER)
    old = tmp_path / "embedding.py"  # as archives built before the rooms carry it
    old.write_text(
        '"""Sentence embeddings."""\n\nfrom ts_compiled_handlers.tasks.embedding import EmbeddingTask\n'
        "from ts_compiled_handlers.torchserve import TorchServeHandler\n\n\n"
        "class EmbeddingHandler(TorchServeHandler):\n    task_class = EmbeddingTask\n"
    )
    assert is_stock_handler(old)
    own = tmp_path / "mine.py"
    own.write_text(old.read_text() + "\n    def postprocess(self, data):\n        return super().postprocess(data)\n")
    assert not is_stock_handler(own)
    (tmp_path / "broken.py").write_text("class (")
    assert not is_stock_handler(tmp_path / "broken.py") and not is_stock_handler(tmp_path / "missing.py")
