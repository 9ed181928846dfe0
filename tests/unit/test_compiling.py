"""Regional compilation's pure parts: finding the repeated block, marking its inputs' dynamic dims."""

import torch

from ts_compiled_handlers.compiling.compiling import block_dynamic_dims, repeated_blocks


def test_the_repeated_block_is_the_longest_list_of_one_class():
    model = torch.nn.Module()
    model.heads = torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.ReLU()])  # mixed: not a block list
    model.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(3)])
    model.pair = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(2)])
    assert repeated_blocks(model) is model.layers
    assert repeated_blocks(torch.nn.Linear(2, 2)) is None


def test_block_inputs_mark_batch_and_length_not_a_hidden_size_of_the_same_value():
    batch, seq_len = 4, 32
    hidden = torch.zeros(batch, seq_len, 32)  # hidden size == length: only dim 1 is the length
    assert block_dynamic_dims(hidden, batch, seq_len, "all") == [0, 1]
    assert block_dynamic_dims(torch.zeros(batch, 1, 1, seq_len), batch, seq_len, "all") == [0, 3]
    assert block_dynamic_dims(torch.zeros(batch, 1, seq_len, seq_len), batch, seq_len, "all") == [0, 2, 3]
    assert block_dynamic_dims(hidden, batch, seq_len, "batch") == [0]
    assert block_dynamic_dims(torch.zeros(1, seq_len, 8), batch, seq_len, "all") == [1]  # a broadcast batch
    assert block_dynamic_dims(torch.zeros(batch, 1, 8), batch, 1, "all") == [0]  # length 1 is not marked


def test_freezing_is_on_for_a_model_on_the_cpu_unless_the_config_says():
    from ts_compiled_handlers.compiling.compiling import CompiledModel
    from ts_compiled_handlers.configuration.config import parse

    def freezes(module, freezing="auto"):
        options = parse({"handler": {"compile": {"freezing": freezing}}}).compile
        return CompiledModel(module, options, graphs_needed=1).freezes

    assert freezes(torch.nn.Linear(2, 2)) is True
    assert freezes(torch.nn.Linear(2, 2), False) is False
    assert freezes(torch.nn.Linear(2, 2, device="meta")) is False  # not the CPU (a GPU's model): off
    assert freezes(torch.nn.Linear(2, 2, device="meta"), True) is True
    regional = parse({"handler": {"compile": {"regional": True}}}).compile  # one graph for blocks of other weights
    assert CompiledModel(torch.nn.Linear(2, 2), regional, graphs_needed=1).freezes is False
    auto = parse({}).compile  # a task whose graphs drift when frozen (generation): auto leaves them unfrozen
    assert CompiledModel(torch.nn.Linear(2, 2), auto, graphs_needed=1, task_freezes=False).freezes is False
    forced = parse({"handler": {"compile": {"freezing": True}}}).compile
    assert CompiledModel(torch.nn.Linear(2, 2), forced, graphs_needed=1, task_freezes=False).freezes is True
