"""`hfserve embed-corpus INPUT OUTPUT --archive minilm.mar`: embed a corpus with Ray Data.

    hfserve embed-corpus corpus.jsonl vectors.parquet --archive model_store/minilm.mar --actors 2
    hfserve embed-corpus docs.parquet out/ --archive /shared/minilm.mar --address ray://head:10001

INPUT and OUTPUT are Parquet or JSON Lines (by their suffix: .parquet, .jsonl or .json; a folder
is read as Parquet, and written as Parquet unless --format says otherwise). Each row's
`--text-column` is embedded into `--output-column` by `--actors` actors of the archive
(handlers/servers/ray/data.py), on a Ray cluster started here for the job (a local one of this machine's
CPUs) or the one `--address` names. Ray Data shows its progress bar as the rows go.
`--chunk-tokens N --chunk-overlap M` cuts long documents into chunks and writes a row per chunk
(its text, index and character span beside the document's columns), or with `--per-document mean`
a row per document; `--precision` writes int8, uint8, binary or ubinary vectors.
Needs the `ray` extra: pip install 'ts-compiled-handlers[ray]'.
"""

import argparse
import math
import os
import time
from pathlib import Path

from ts_compiled_handlers.request.chunking import ChunkSize
from ts_compiled_handlers.scripts.cli import HelpFormatter, UserError
from ts_compiled_handlers.tasks.precisions import PRECISIONS

# Reading and writing take a sliver of a CPU each, so that several run in the CPU left beside the actors.
IO_CPUS = 0.1


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("input", type=Path, help="the corpus: a .parquet or .jsonl file, or a folder of Parquet files")
    parser.add_argument(
        "output", type=Path, help="where the rows with their embeddings go (.parquet, .jsonl, or a folder)"
    )
    parser.add_argument("--archive", required=True, type=Path, help="an embedding .mar that `hfserve build` made")
    parser.add_argument("--text-column", default="text", help="the column embedded")
    parser.add_argument("--output-column", default="embedding", help="the column the vectors go to")
    parser.add_argument(
        "--precision",
        default="float32",
        choices=PRECISIONS,
        help="the vectors' type: int8/uint8 use the archive's ranges, binary/ubinary pack signs 8 to a byte",
    )
    parser.add_argument(
        "--chunk-tokens",
        type=int,
        help="cut each document into chunks of at most N tokens (never inside a token) and embed each: a row a chunk",
    )
    parser.add_argument("--chunk-overlap", type=int, default=0, help="tokens a chunk shares with the one before")
    parser.add_argument(
        "--per-document", choices=("mean",), help="with --chunk-tokens: one row a document, its chunks' mean vector"
    )
    parser.add_argument("--actors", type=int, default=1, help="actors of the archive (each a worker)")
    parser.add_argument("--cpus-per-actor", type=float, default=1, help="each actor's CPUs (its threads)")
    parser.add_argument("--batch-size", type=int, default=256, help="rows per actor call (one engine run: packed)")
    parser.add_argument("--address", help="an existing Ray cluster (default: start a local one for the job)")
    parser.add_argument("--format", choices=("parquet", "jsonl"), help="OUTPUT's format (default: from its suffix)")
    return parser.parse_args(argv)


def file_format(path: Path, given: str | None = None) -> str:
    if given:
        return given
    if path.suffix in (".jsonl", ".json"):
        return "jsonl"
    if path.suffix in (".parquet", "") or path.is_dir():
        return "parquet"
    raise UserError(f"{path}: a .parquet or .jsonl file (or a folder of Parquet) is needed, or --format")


def embedder(args):
    """The callable class and its arguments: chunked where --chunk-tokens asks (checked here first)."""
    from ts_compiled_handlers.servers.ray.data import ChunkEmbedder, Embedder

    kwargs = {
        "archive": str(args.archive.resolve()),
        "text_column": args.text_column,
        "output_column": args.output_column,
        "precision": args.precision,
    }
    if args.chunk_tokens is None:
        if args.per_document or args.chunk_overlap:
            raise UserError("--chunk-overlap and --per-document need --chunk-tokens")
        return Embedder, kwargs
    try:
        ChunkSize(args.chunk_tokens, args.chunk_overlap).check(model_limit=args.chunk_tokens)
    except ValueError as error:
        raise UserError(str(error)) from None
    if args.per_document and args.precision != "float32":  # checked here, before a cluster starts
        raise UserError("--per-document mean pools float32 vectors: leave --precision at float32")
    chunking = {"chunk_tokens": args.chunk_tokens, "chunk_overlap": args.chunk_overlap}
    return ChunkEmbedder, {**kwargs, **chunking, "per_document": args.per_document}


def main(argv=None) -> None:
    args = parse_args(argv)
    if not args.input.exists():
        raise UserError(f"no corpus at {args.input}")
    if not args.archive.is_file():
        raise UserError(f"no archive at {args.archive}; build one with `hfserve build`")
    try:
        import ray
    except ImportError as error:
        raise UserError("embed-corpus needs Ray: pip install 'ts-compiled-handlers[ray]'") from error
    callable_class, kwargs = embedder(args)
    start_or_join(ray, args)
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # rows out as they came in
    began = time.perf_counter()
    read = ray.data.read_json if file_format(args.input) == "jsonl" else ray.data.read_parquet
    dataset = read(str(args.input), num_cpus=IO_CPUS).map_batches(
        callable_class,
        fn_constructor_kwargs=kwargs,
        compute=ray.data.ActorPoolStrategy(size=args.actors),
        num_cpus=args.cpus_per_actor,
        batch_size=args.batch_size,
    )
    if file_format(args.output, args.format) == "jsonl":
        rows = write_jsonl(dataset, args.output)
    else:
        dataset.write_parquet(str(args.output), ray_remote_args={"num_cpus": IO_CPUS})
        rows = ray.data.read_parquet(str(args.output)).count()  # from the files' metadata
    print(f"{rows} rows embedded into {args.output} in {time.perf_counter() - began:.1f} s")


def start_or_join(ray, args) -> None:
    """Join the cluster `--address` names, or start a local one with a CPU beside the actors' for
    reading and writing (Ray's CPUs are logical: reading and writing take little of a core). On a
    cluster whose CPUs the actors would all hold, no read task could ever run: refused."""
    wanted = args.actors * args.cpus_per_actor
    if args.address is None:
        ray.init(num_cpus=max(os.cpu_count() or 1, math.ceil(wanted) + 1), include_dashboard=False, log_to_driver=False)
        return
    ray.init(address=args.address, log_to_driver=False)
    total = ray.cluster_resources().get("CPU", 0)
    if wanted >= total:
        raise UserError(
            f"--actors {args.actors} x --cpus-per-actor {args.cpus_per_actor:g} would hold all {total:g} CPUs of the "
            "cluster, leaving none to read the corpus: use fewer actors or fewer CPUs each"
        )


def write_jsonl(dataset, output: Path) -> int:
    """One JSON Lines file (Ray Data would write a folder of them); the rows written."""
    rows = 0
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("w") as file:
        for batch in dataset.iter_batches(batch_format="pandas"):
            file.write(batch.to_json(orient="records", lines=True))
            rows += len(batch)
    return rows


if __name__ == "__main__":
    main()
