"""Ray Data's ChunkEmbedder in process (no cluster: an actor's code, called as Ray calls it) over
MiniLM's worker (its real WordPiece vocabulary), built from its folder and served eagerly (opening an
archive is tests/integration/test_ray.py's): a run of no whitespace chunked so
that each chunk, read alone, fits the archive's limit (a chunk of it once came to 33 tokens and a
413 failed the job); a null text refused by its row, never embedded as "None"; embed-corpus's
flags that the actors would refuse, refused before a cluster starts."""

import numpy as np
import pytest
from fakes import ready_handler

from ts_compiled_handlers.servers.ray.data import ArchiveBatches, ChunkEmbedder

RUN = "Pneumonoultramicroscopicsilicovolcanoconiosis-hydroxymethylpyrimidinephosphatase" * 3


@pytest.fixture(scope="module")
def embedder(minilm_dir):
    handler = ready_handler("embedding", minilm_dir, compile={"enable": False}, buckets={"seq_lens": [16, 32]})

    def from_the_handler(self, archive: str, text_column: str = "text"):  # what an actor opens, built already
        self.worker, self.text_column = handler.worker, text_column

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ArchiveBatches, "__init__", from_the_handler)
        return ChunkEmbedder("minilm.mar", chunk_tokens=30, chunk_overlap=4)


def test_every_chunk_of_a_run_without_whitespace_fits_the_archive_and_is_embedded(embedder):
    assert embedder.text_limit() == 30  # 32 less [CLS] and [SEP]: the chunk size may take all of it
    documents = np.array(["see " + RUN + " end", "a short one"], dtype=object)
    rows = embedder({"text": documents, "id": np.array([7, 8])})
    chunks = list(rows["text"])
    assert max(embedder.token_counts(chunks)) <= 30 and len(rows["embedding"]) == len(chunks) > 2
    assert list(rows["id"]).count(8) == 1 and chunks[-1] == "a short one"


def test_a_null_text_fails_the_batch_naming_its_row(embedder):
    with pytest.raises(ValueError, match=r"text\[1\] is NoneType, not text"):
        embedder({"text": np.array(["fine", None], dtype=object)})


def test_embed_corpus_refuses_pooled_int8_before_any_cluster_starts(tmp_path):
    from ts_compiled_handlers.scripts import embed_corpus
    from ts_compiled_handlers.scripts.cli import UserError

    archive = tmp_path / "m.mar"
    archive.write_bytes(b"")
    argv = ["in.jsonl", "out.parquet", "--archive", str(archive), "--chunk-tokens", "64", "--per-document", "mean"]
    with pytest.raises(UserError, match="--per-document mean pools float32 vectors"):
        embed_corpus.embedder(embed_corpus.parse_args([*argv, "--precision", "int8"]))
