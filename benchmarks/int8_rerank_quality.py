"""Whether `quantize: int8` keeps a trained cross-encoder's rankings (issue 57's bar: the int8 scores
in the same order as float32's on at least 95% of queries), as a worker serves them.

The cross-encoder is benchmarks/distilled_reranker.py's (MiniLM trained here by distillation; make
it first). Each held-out query comes with ten candidates: its passage and the nine other held-out
passages the teacher finds nearest, a first stage's top ten. Each setting starts a worker in
process (`dtype: auto`, quantized and gated but for `none`, compiled unless `--eager`) and scores
every (query, candidate) pair through its engine, as the rerank routes do. Against float32 eager:
the share of queries whose ten candidates come out in the same order, whose first is the same,
whose first three are the same in the same order, the pairwise order agreement, and the largest
logit error; and, for each setting, how often its first is the query's own passage.

    python benchmarks/distilled_reranker.py --out runs/distilled-reranker
    python benchmarks/int8_rerank_quality.py --model runs/distilled-reranker

Prints a table and writes runs/int8_rerank_quality.json.
"""

import argparse
import json
import logging
import os
from pathlib import Path

os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")  # torchao's CUDA kernels: not used here

import torch  # noqa: E402

from ts_compiled_handlers.benchmarks import measure  # noqa: E402

SETTINGS = ("none", "int8", "int8-all")  # `none`: bfloat16 alone, the baseline int8 adds its drift to


def scores(handler, tokenizer, queries: list[dict]) -> torch.Tensor:
    """(queries, candidates) logits, each pair tokenized as the rerank routes tokenize it."""
    pairs = [(entry["query"], text) for entry in queries for text in entry["candidates"]]
    encoded = tokenizer(
        [q for q, _ in pairs], [t for _, t in pairs], truncation=True, max_length=handler.engine.plan.max_seq_len
    )
    rows = handler.engine.run(encoded["input_ids"], type_ids=encoded["token_type_ids"]).rows
    return torch.stack([row.flatten()[0] for row in rows]).float().view(len(queries), -1)


def agreement(reference: torch.Tensor, candidate: torch.Tensor) -> dict:
    """How far the candidate's rankings keep the reference's, over queries (rows)."""
    order, found = reference.argsort(dim=1, descending=True), candidate.argsort(dim=1, descending=True)
    pairs = torch.triu_indices(reference.shape[1], reference.shape[1], offset=1)
    same_sign = torch.sign(reference[:, pairs[0]] - reference[:, pairs[1]]) == torch.sign(
        candidate[:, pairs[0]] - candidate[:, pairs[1]]
    )
    return {
        "same_order": (order == found).all(dim=1).float().mean().item(),
        "same_first": (order[:, 0] == found[:, 0]).float().mean().item(),
        "same_top3": (order[:, :3] == found[:, :3]).all(dim=1).float().mean().item(),
        "pairwise": same_sign.float().mean().item(),
        "max_logit_error": (reference - candidate).abs().max().item(),
        "own_passage_first": (found[:, 0] == 0).float().mean().item(),  # candidate 0 is the query's passage
    }


def main(argv=None) -> None:
    from sentence_transformers import CrossEncoder
    from transformers import AutoTokenizer

    from ts_compiled_handlers.benchmarks.in_process import ready_handler

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("runs/distilled-reranker"))
    parser.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS), help="`quantize` values")
    parser.add_argument("--eager", action="store_true", help="the int8 models uncompiled (faster to run)")
    parser.add_argument("--out", type=Path, default=Path("runs/int8_rerank_quality.json"), help="the JSON written")
    args = parser.parse_args(argv)
    for room in ("quantizing", "int8_search"):  # which linears int8 keeps in floating point, and why
        logger = logging.getLogger(f"ts_compiled_handlers.startup.{room}")
        logger.setLevel(logging.INFO)
        logger.addHandler(logging.StreamHandler())
    queries = json.loads((args.model / "eval_queries.json").read_text())["queries"]
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    reference_handler = ready_handler("text-classification", args.model, compile={"enable": False})  # float32
    expected = scores(reference_handler, tokenizer, queries)
    del reference_handler
    pairs = [(entry["query"], text) for entry in queries[:20] for text in entry["candidates"]]
    their = torch.tensor(CrossEncoder(str(args.model), device="cpu").predict(pairs, activation_fn=torch.nn.Identity()))
    print(f"{len(queries)} queries; float32 eager against CrossEncoder.predict (20 queries): largest logit "
          f"error {(their.view(20, -1) - expected[:20]).abs().max().item():.2e}")  # fmt: skip
    baseline = agreement(expected, expected)
    results = [{"quantize": "float32 eager", **baseline}]
    print(f"{'quantize':<13} {'same order':>10} {'same first':>10} {'same top3':>9} {'pairwise':>8} "
          f"{'max logit err':>13} {'own first':>9}  the gate at ready")  # fmt: skip
    print(f"{'float32 eager':<13} {'':>10} {'':>10} {'':>9} {'':>8} {'':>13} {baseline['own_passage_first']:>9.3f}")
    for setting in args.settings:
        loose = {"warmup": {"tolerance": measure.INT8_ALL_TOLERANCE}} if setting == "int8-all" else {}
        compile_options = {"enable": not args.eager, "on_failure": "fail"}
        handler = ready_handler(
            "text-classification", args.model, dtype="auto", quantize=setting, compile=compile_options, **loose
        )
        gate = handler.engine.model.int8_gate.last if setting != "none" else None
        found = agreement(expected, scores(handler, tokenizer, queries))
        results.append({"quantize": setting, **found, "gate": str(gate)})
        print(
            f"{setting:<13} {found['same_order']:>10.3f} {found['same_first']:>10.3f} {found['same_top3']:>9.3f} "
            f"{found['pairwise']:>8.4f} {found['max_logit_error']:>13.3f} {found['own_passage_first']:>9.3f}  "
            f"{gate or '-'}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"compiled": not args.eager, "queries": len(queries), "results": results}, indent=2))


if __name__ == "__main__":
    main()
