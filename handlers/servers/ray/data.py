"""Bulk inference with Ray Data: an archive's worker as a callable class for `Dataset.map_batches`.

    dataset.map_batches(Embedder, fn_constructor_kwargs={"archive": "/shared/minilm.mar"},
                        compute=ray.data.ActorPoolStrategy(size=2), num_cpus=1, batch_size=256)

Each actor builds the archive's worker as a TorchServe worker does (its AOT package or compile
cache, warmed over the grid, checked), with the actor's CPUs as its threads; each batch's texts go
through the engine in one go, so they are packed or grouped by length exactly as a server's call
is. Texts longer than the model's limit are truncated as the archive says (`buckets.overflow`).
"""

import os
import stat
from pathlib import Path

import numpy as np
import ray

from ts_compiled_handlers.configuration.config import parse
from ts_compiled_handlers.graphs.pooling import unit_rows
from ts_compiled_handlers.protocols import Request
from ts_compiled_handlers.request.chunking import ChunkSize, fitting_spans
from ts_compiled_handlers.request.payload import RequestError, check_params
from ts_compiled_handlers.request.tokenizing import Accepted
from ts_compiled_handlers.servers.archive import Archive, show_worker_logs, with_threads
from ts_compiled_handlers.tasks.classification import ClassificationTask
from ts_compiled_handlers.tasks.embedding import EmbeddingTask
from ts_compiled_handlers.tasks.image_text import ImageTextTask
from ts_compiled_handlers.tasks.m3 import M3EmbeddingTask, index_order
from ts_compiled_handlers.tasks.multi_vector import MultiVectorTask


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

    task = EmbeddingTask.NAME

    def __init__(
        self, archive: str, text_column: str = "text", output_column: str = "embedding", precision: str = "float32"
    ):
        super().__init__(archive, text_column)
        self.output_column = output_column
        self.params = self.checked({"precision": precision})

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        answers = self.answers(list(batch[self.text_column]), self.params)
        vectors = np.stack([answer.embedding for answer in answers])
        return {**batch, self.output_column: vectors}


class ChunkEmbedder(Embedder):
    """Long documents in: each cut into chunks of at most `chunk_tokens` tokens, `chunk_overlap`
    shared (handlers/request/chunking.py), all of a batch's chunks embedded in one engine run. Out:
    a row per chunk, in order, with the document's other columns, the chunk's text in the text
    column, its index (`chunk`) and character span (`chunk_start`, `chunk_end`); or with
    `per_document="mean"` a row per document, its chunks' mean vector (normalized as the archive
    normalizes). No text is cut: a chunk over the model's limit fails the job."""

    def __init__(
        self,
        archive: str,
        chunk_tokens: int,
        chunk_overlap: int = 0,
        per_document: str | None = None,
        text_column: str = "text",
        output_column: str = "embedding",
        precision: str = "float32",
    ):
        super().__init__(archive, text_column, output_column, precision)
        if per_document not in (None, "mean"):
            raise ValueError(f"per_document must be 'mean' or None, not {per_document!r}")
        if per_document and precision != "float32":
            raise ValueError("per_document pools float32 vectors: leave precision at float32")
        self.size, self.per_document = ChunkSize(chunk_tokens, chunk_overlap), per_document
        self.tokenizer = self.worker.reader.spec.tokenizer
        self.params = {**self.params, "truncate": False}  # a chunk over the limit is refused, never cut
        self.size.check(self.text_limit())

    def text_limit(self) -> int:
        """The most tokens a chunk may have: the archive's limit less special tokens and the default prompt."""
        prompt = self.worker.task.model_texts(Request([""], {}, protocol=None))[0]
        prompt_tokens = len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"]) if prompt else 0
        specials = self.tokenizer.num_special_tokens_to_add(pair=False)
        return self.worker.engine.plan.max_seq_len - specials - prompt_tokens

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        documents = list(batch[self.text_column])
        for row, text in enumerate(documents):
            if not isinstance(text, str):  # str() would embed a null as the word "None"
                raise ValueError(f"{self.text_column}[{row}] is {type(text).__name__}, not text")
        offsets = self.tokenizer(documents, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        spans = [
            fitting_spans(text, marks, self.size, self.token_counts)
            for marks, text in zip(offsets, documents, strict=True)
        ]
        texts = [text[start:end] for text, pieces in zip(documents, spans, strict=True) for start, end in pieces]
        vectors = np.stack([answer.embedding for answer in self.answers(texts, self.params)])
        counts = [len(pieces) for pieces in spans]
        if self.per_document:
            return {**batch, self.output_column: self.pooled(vectors, counts)}
        rows = {column: np.repeat(values, counts, axis=0) for column, values in batch.items()}
        rows[self.text_column] = np.array(texts, dtype=object)
        rows["chunk"] = np.concatenate([np.arange(count) for count in counts])
        rows["chunk_start"], rows["chunk_end"] = np.array([span for pieces in spans for span in pieces]).T
        return {**rows, self.output_column: vectors}

    def token_counts(self, texts: list[str]) -> list[int]:
        return [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def pooled(self, vectors: np.ndarray, counts: list[int]) -> np.ndarray:
        means = np.stack([part.mean(axis=0) for part in np.split(vectors, np.cumsum(counts)[:-1])])
        if self.worker.task.normalize_default:
            means = unit_rows(means)
        return means.astype(np.float32)


class Classifier(ArchiveBatches):
    """Column `text` in, the best `label` and its `score` out (names configurable)."""

    task = ClassificationTask.NAME

    def __init__(
        self, archive: str, text_column: str = "text", label_column: str = "label", score_column: str = "score"
    ):
        super().__init__(archive, text_column)
        self.label_column, self.score_column = label_column, score_column

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        best = [labels[0] for labels in self.answers(list(batch[self.text_column]))]
        labels = np.array([answer.label for answer in best], dtype=object)
        scores = np.array([answer.score for answer in best], dtype=np.float32)
        return {**batch, self.label_column: labels, self.score_column: scores}


class MultiVectorEmbedder(ArchiveBatches):
    """Column `text` in, `embedding` out for a ColBERT archive: each row's token vectors, a
    (tokens, size) float32 array, for `input_type` query or document (handlers/tasks/multi_vector.py)."""

    task = MultiVectorTask.NAME

    def __init__(self, archive: str, input_type: str, text_column: str = "text", output_column: str = "embedding"):
        super().__init__(archive, text_column)
        self.output_column = output_column
        self.params = self.checked({"input_type": input_type})

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        answers = self.answers(list(batch[self.text_column]), self.params)
        return {**batch, self.output_column: ragged([answer.embedding for answer in answers])}


def ragged(rows: list) -> np.ndarray:
    """Rows of different lengths as one column: Ray stores them as variable-shaped tensors."""
    column = np.empty(len(rows), dtype=object)
    for index, row in enumerate(rows):
        column[index] = np.asarray(row)
    return column


class M3Embedder(ArchiveBatches):
    """Column `text` in, for a bge-m3 archive, the outputs asked for (handlers/tasks/m3.py):
    `dense_vecs` (a vector per row), `sparse_indices` and `sparse_values` (its lexical weights in
    index order), `colbert_vecs` (a (tokens - 1, size) array per row)."""

    task = M3EmbeddingTask.NAME

    def __init__(
        self, archive: str, return_dense=True, return_sparse=False, return_colbert_vecs=False, text_column="text"
    ):
        super().__init__(archive, text_column)
        asked = {
            "return_dense": return_dense,
            "return_sparse": return_sparse,
            "return_colbert_vecs": return_colbert_vecs,
        }
        self.params = self.checked(asked)
        if not any(self.params.values()):
            raise ValueError("ask for at least one output: return_dense, return_sparse, return_colbert_vecs")

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        answers = self.answers(list(batch[self.text_column]), self.params)
        columns = {}
        if self.params["return_dense"]:
            columns["dense_vecs"] = np.stack([answer.dense_vecs for answer in answers])
        if self.params["return_sparse"]:
            entries = [index_order(answer.lexical_weights) for answer in answers]
            columns["sparse_indices"] = ragged([np.array(one.indices, dtype=np.int64) for one in entries])
            columns["sparse_values"] = ragged([np.array(one.values, dtype=np.float32) for one in entries])
        if self.params["return_colbert_vecs"]:
            columns["colbert_vecs"] = ragged([answer.colbert_vecs for answer in answers])
        return {**batch, **columns}


class ImageEmbedder(ArchiveBatches):
    """Column `image` in, for a CLIP archive (handlers/tasks/image_text.py): each row an image's
    bytes (a Parquet binary column) or the path of its file under `image_root`; `embedding` out
    (names configurable). Images are decoded under the archive's limits, one at a time, each row a
    request of its own (a batch may hold more images than a request may); a bad one fails the job,
    naming its row."""

    task = ImageTextTask.NAME

    def __init__(
        self,
        archive: str,
        image_column: str = "image",
        output_column: str = "embedding",
        normalize=None,
        image_root: str | None = None,
    ):
        """`normalize`: None answers as the archive does (a sentence-transformers folder's Normalize).
        `image_root`: the folder a path column's files are read from (none: paths are refused)."""
        super().__init__(archive, image_column)
        self.output_column = output_column
        self.params = self.checked({} if normalize is None else {"normalize": normalize})
        self.image_root = None if image_root is None else Path(image_root).resolve()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        accepted = [self.accepted(row, value) for row, value in enumerate(batch[self.text_column])]
        outputs = zip(accepted, self.worker.run(accepted), strict=True)  # the batch's images in one go
        vectors = np.stack([self.worker.task.answer(one, rows)[0].embedding for one, rows in outputs])
        return {**batch, self.output_column: vectors}

    def accepted(self, row: int, value) -> Accepted:
        """A row's image as a request of its own, so a batch of any size keeps within a request's
        image budgets (`images:`); read and decoded under the archive's limits, refused naming its row."""
        task, field = self.worker.task, f"{self.text_column}[{row}]"
        try:
            data = image_bytes(value, field, self.image_root, task.limits.max_bytes)
            request = Request([], self.params, protocol=None, images=task.read_images([data], [field], [0]))
        except RequestError as error:
            raise ValueError(error.message) from None
        return Accepted(row, request, self.worker.reader.tokenized(request))


def image_bytes(value, field: str, root: Path | None, max_bytes: int) -> bytes:
    """A row's image: its bytes, or those of the file its path names under `root`."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if not isinstance(value, str):
        raise RequestError(400, f"'{field}' must be an image's bytes or its file's path", field)
    if root is None:
        raise RequestError(400, f"'{field}' is a path: give ImageEmbedder the folder to read from (image_root)", field)
    path = (root / value).resolve()  # symlinks and `..` followed before the check
    if not path.is_relative_to(root):
        raise RequestError(403, f"'{field}': {value} is outside {root}, the folder images are read from", field)
    return regular_file_bytes(path, field, max_bytes)


def regular_file_bytes(path: Path, field: str, max_bytes: int) -> bytes:
    """At most `max_bytes` of a regular file. Opened without blocking (a FIFO would wait for a
    writer) and not through a last-step symlink, then checked on the open file itself, so a link,
    FIFO or device swapped in after the check is refused; one byte past the limit is read to
    refuse a longer file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError as error:
        raise RequestError(400, f"'{field}': {path} cannot be opened ({error.strerror})", field) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RequestError(400, f"'{field}': {path} is not a regular file", field)
        with open(fd, "rb", closefd=False) as file:
            data = file.read(max_bytes + 1)
    except OSError as error:
        raise RequestError(400, f"'{field}': {path} cannot be read ({error.strerror})", field) from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise RequestError(413, f"'{field}': {path} is over {max_bytes} bytes, the most an image may take", field)
    return data
