"""Model loads in threads of one process (an in-process build of several archives, a test's):
one at a time, so that transformers' class-wide swaps during a load are always undone."""

from concurrent.futures import ThreadPoolExecutor

import torch
from transformers import AutoModelForMaskedLM, PreTrainedModel

from ts_compiled_handlers.configuration.config import HandlerConfig
from ts_compiled_handlers.tasks import Task


class MaskedLM(Task):
    """A task whose model ties its decoder to its embeddings: a tie skipped leaves it on meta."""

    def build_model(self, model_dir):
        return AutoModelForMaskedLM.from_pretrained(model_dir, dtype=torch.float32, use_safetensors=True)


def test_models_loaded_in_threads_keep_their_tied_weights_and_leave_transformers_as_it_was(tiny_models):
    # Without the lock, transformers 5.24 left tie_weights a no-op after the first round of such loads here.
    tie_weights, normal = PreTrainedModel.tie_weights, torch.nn.init.normal_
    task = MaskedLM(HandlerConfig())
    with ThreadPoolExecutor(4) as pool:
        models = list(pool.map(lambda _: task.load_model(tiny_models["sparse-embedding"]), range(8)))
    assert PreTrainedModel.tie_weights is tie_weights and torch.nn.init.normal_ is normal
    assert all(parameter.device.type == "cpu" for model in models for parameter in model.parameters())
    decoder, embeddings = models[-1].get_output_embeddings().weight, models[-1].get_input_embeddings().weight
    assert decoder is embeddings
    again = AutoModelForMaskedLM.from_pretrained(tiny_models["sparse-embedding"])  # a load after them is whole
    assert again.get_output_embeddings().weight is again.get_input_embeddings().weight
