"""Bulk inference with Ray Data: an archive's worker as a callable class for `Dataset.map_batches`.

    dataset.map_batches(Embedder, fn_constructor_kwargs={"archive": "/shared/minilm.mar"},
                        compute=ray.data.ActorPoolStrategy(size=2), num_cpus=1, batch_size=256)

Each actor builds the archive's worker as a TorchServe worker does (its AOT package or compile
cache, warmed over the grid, checked), with the actor's CPUs as its threads; each batch's texts go
through the engine in one go, so they are packed or grouped by length exactly as a server's call
is. Texts longer than the model's limit are truncated as the archive says (`buckets.overflow`).
"""

import numpy as np
import ray

from ts_compiled_handlers.protocols import Request
from ts_compiled_handlers.request.payload import RequestError, check_params
from ts_compiled_handlers.request.tokenizing import Accepted
from ts_compiled_handlers.servers.archive import Archive, show_worker_logs, with_threads
from ts_compiled_handlers.startup.config import parse


class ArchiveBatches:
    """The archive's worker, built once per actor; `answers(texts)`: the task's answer per text."""

    task = None  # the task an archive must serve for this class (None: any)

    def __init__(self, archive: str, text_column: str = "text"):
        opened = Archive.open(archive)
        show_worker_logs()
        task = parse(opened.yaml_config).task
        if self.task is not None and task != self.task:
            raise ValueError(f"{archive} serves {task}; {type(self).__name__} needs a {self.task} archive")
        task_class, worker_class = opened.served_by()
        self.worker = worker_class.build(opened.placement(with_threads(opened.yaml_config, actor_cpus())), task_class)
        self.text_column = text_column

    def answers(self, texts: list[str], params: dict | None = None) -> list:
        """The task's answer per text; `params` checked already (`checked`)."""
        request = Request(texts, params or {}, protocol=None)  # answered as arrays: no protocol, no JSON budget
        accepted = Accepted(0, request, self.worker.reader.tokenized(request))
        (rows,) = self.worker.run([accepted])
        return self.worker.task.answer(accepted, rows)

    def checked(self, params: dict) -> dict:
        """Request parameters for every batch, checked as a request's are (ValueError if refused)."""
        try:
            return check_params(params, self.worker.reader.spec.params)
        except RequestError as error:
            raise ValueError(error.message) from None


def actor_cpus() -> float | None:
    """The CPUs Ray gave this actor (None outside one: the worker then shares the machine's cores)."""
    return ray.get_runtime_context().get_assigned_resources().get("CPU") if ray.is_initialized() else None


class Embedder(ArchiveBatches):
    """Column `text` in, `embedding` out (a vector per row; both names configurable): float32, or
    the `precision` a request may ask for (int8, uint8, binary, ubinary: handlers/tasks/precisions.py)."""

    task = "embedding"

    def __init__(
        self, archive: str, text_column: str = "text", output_column: str = "embedding", precision: str = "float32"
    ):
        super().__init__(archive, text_column)
        self.output_column = output_column
        self.params = self.checked({"precision": precision})

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        answers = self.answers(list(batch[self.text_column]), self.params)
        vectors = np.stack([answer["embedding"] for answer in answers])
        return {**batch, self.output_column: vectors}


class Classifier(ArchiveBatches):
    """Column `text` in, the best `label` and its `score` out (names configurable)."""

    task = "text-classification"

    def __init__(
        self, archive: str, text_column: str = "text", label_column: str = "label", score_column: str = "score"
    ):
        super().__init__(archive, text_column)
        self.label_column, self.score_column = label_column, score_column

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        best = [labels[0] for labels in self.answers(list(batch[self.text_column]))]
        labels = np.array([answer["label"] for answer in best], dtype=object)
        scores = np.array([answer["score"] for answer in best], dtype=np.float32)
        return {**batch, self.label_column: labels, self.score_column: scores}
