"""Generation benchmark: eager `model.generate()` vs our compiled static-cache decode, same dtype, one run.

A Llama-like model with random weights (scripts/make_tiny_models.py --generation-size bench:
hidden 256, 4 layers) generates NEW tokens for batches of 1 and 8 prompts. Both contenders make
exactly NEW tokens per prompt (eos is ignored by generate's `min_new_tokens`; our handler is asked
for prompts whose greedy path does not hit eos, checked). Tokens/s is prompts x NEW / median time.

    python benchmarks/benchmark_generation.py [--new-tokens 64] [--repeats 5] [--dtype float32]
"""

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from ts_compiled_handlers.benchmarks.in_process import make_context, start_batch
from ts_compiled_handlers.scripts.make_tiny_models import make
from ts_compiled_handlers.servers.torchserve.handler import Handler

PROMPT = "alice walks to paris and bob runs to london with carol"
BATCHES = (1, 8)


def timed(run, repeats: int) -> float:
    run()  # warm
    seconds = []
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds)


def eager_generate(handler: Handler, batch: int, new_tokens: int, repeats: int) -> float:
    lm = handler.engine.model.eager.lm
    inputs = handler.tokenizer([PROMPT] * batch, return_tensors="pt", padding=True)

    def run():
        with torch.inference_mode():
            out = lm.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        assert out.shape[1] - inputs["input_ids"].shape[1] == new_tokens

    return timed(run, repeats)


def compiled_decode(handler: Handler, batch: int, new_tokens: int, repeats: int) -> float:
    bodies = [{"body": {"inputs": PROMPT, "max_new_tokens": new_tokens}} for _ in range(batch)]

    def run():
        start_batch(handler.context, ["application/json"] * batch)
        answers = [json.loads(answer) for answer in handler.handle(bodies, handler.context)]
        assert all(answer["generated_tokens"] == new_tokens for answer in answers), "eos cut a row short"

    return timed(run, repeats)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--out", type=Path, default=Path("runs") / "benchmark_generation.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as temp:
        folder = make(Path(temp), ["text-generation"], generation_size="bench")["text-generation"]
        handler = Handler()
        config = {
            "handler": {
                "task": "text-generation",
                "dtype": args.dtype,
                "buckets": {"seq_lens": [16], "batch_sizes": list(BATCHES)},
                "generation": {"max_new_tokens": args.new_tokens},
            }
        }
        handler.initialize(make_context(folder, config))
        rows = []
        for batch in BATCHES:
            eager = eager_generate(handler, batch, args.new_tokens, args.repeats)
            ours = compiled_decode(handler, batch, args.new_tokens, args.repeats)
            tokens = batch * args.new_tokens
            rows.append(
                {
                    "batch": batch,
                    "eager_generate_tokens_per_s": round(tokens / eager, 1),
                    "compiled_static_cache_tokens_per_s": round(tokens / ours, 1),
                    "speedup": round(eager / ours, 2),
                }
            )
        recompiles = handler.engine.model.recompiles_after_ready
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
        "torch": torch.__version__,
        "dtype": args.dtype,
        "new_tokens": args.new_tokens,
        "recompiles_after_ready": recompiles,
        "rows": rows,
    }
    print(f"{'batch':>5} {'eager generate tok/s':>21} {'compiled decode tok/s':>22} {'speedup':>8}")
    for row in rows:
        print(
            f"{row['batch']:>5} {row['eager_generate_tokens_per_s']:>21} "
            f"{row['compiled_static_cache_tokens_per_s']:>22} {row['speedup']:>7}x"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
