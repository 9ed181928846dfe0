"""Choose sequence-length buckets that minimize expected padding for a sample of request lengths.

    python scripts/plan_buckets.py --lengths lengths.txt -k 5 --max-length 256 --out plan.json
    python scripts/plan_buckets.py --log logs/model_log.log --model-name minilm -k 5 --out plan.json
    python scripts/build_mar.py --model DIR --task embedding --name minilm --plan plan.json

Lengths are token counts (special tokens included): a file of integers (whitespace separated), a
JSON list, a JSON object {length: count}, or the `LengthHistogram` line the handler logs every
`buckets.histogram_every` texts. Every text is padded to the smallest bucket that holds it; the
largest bucket is always `--max-length`, so nothing is truncated that was not before. The plan is exact:
a dynamic program over the distinct (aligned) lengths, O(K * n^2).

It also plans the pack budget (`buckets.pack_tokens`) for the encoder tasks, which pack a batch's
texts into rows (handlers/engine/packing.py): seeded batches of `--batch` texts drawn from the lengths are
packed as the request path packs them with each bucket up to packing.AUTO_BUDGET as the budget,
and the budget with the least cost wins. The cost of a call (scripts/plan_costs.py) is its tokens
plus a fixed part per call; with `--measure MODEL_DIR` it is measured on the model, attention's
part that grows with the length included, so every bucket up to the limit is a candidate budget and
the buckets themselves are weighed by what a row of their length costs (a long-context model's
long rows cost more than their tokens):

    python scripts/plan_buckets.py --lengths lengths.txt --measure runs/tiny/embedding-long --task embedding
"""

import argparse
import dataclasses
import json
import math
import random
from pathlib import Path

from ts_compiled_handlers.configuration.config import BucketConfig
from ts_compiled_handlers.engine.buckets import BucketPlan, seq_bucket
from ts_compiled_handlers.engine.buckets import padded_tokens as group_tokens
from ts_compiled_handlers.engine.layout import Layout
from ts_compiled_handlers.engine.packing import AUTO_BUDGET
from ts_compiled_handlers.scripts import build_mar, plan_costs
from ts_compiled_handlers.scripts.cli import HelpFormatter
from ts_compiled_handlers.scripts.plan_costs import Costs
from ts_compiled_handlers.scripts.task_inference import infer_task
from ts_compiled_handlers.startup.bucket_plan import AUTO_MAX_TOKENS, doubling
from ts_compiled_handlers.worker.traffic_stats import read_histograms

ASSUMED = Costs()  # a call's cost without --measure: its tokens and CALL_TOKENS per call


def aligned(length: int, align: int, max_len: int) -> int:
    """`length` rounded up to a multiple of `align`, capped at `max_len`."""
    return min(math.ceil(length / align) * align, max_len)


def padded_tokens(histogram: dict[int, int], seq_lens: tuple[int, ...]) -> int:
    """Tokens computed when each text is padded to its bucket (over-long texts truncated to the last)."""
    total = 0
    for length, count in histogram.items():
        total += count * (seq_bucket(length, seq_lens) or seq_lens[-1])
    return total


def plan(histogram: dict[int, int], k: int, max_len: int, align: int = 1, costs: Costs = ASSUMED) -> tuple[int, ...]:
    """The at most `k` buckets, the last one `max_len`, that minimize padded tokens, each weighed by
    what a row of its length costs (`costs.row`: its tokens, and its attention where measured)."""
    weights: dict[int, int] = {max_len: 0}
    for length, count in histogram.items():
        key = aligned(length, align, max_len)
        weights[key] = weights.get(key, 0) + count
    candidates = sorted(weights)
    counts = [weights[value] for value in candidates]
    prefix = [0]
    for count in counts:
        prefix.append(prefix[-1] + count)
    size = len(candidates)
    # best[j]: (cost, buckets) covering candidates[0..j] with the last bucket at candidates[j].
    cost = [costs.row(value) for value in candidates]
    best = [(cost[j] * prefix[j + 1], (candidates[j],)) for j in range(size)]
    for _ in range(min(k, size) - 1):
        best = [
            min(
                [best[j]]
                + [
                    (best[i][0] + cost[j] * (prefix[j + 1] - prefix[i + 1]), best[i][1] + (candidates[j],))
                    for i in range(j)
                ]
            )
            for j in range(size)
        ]
    return best[-1][1]


def pack_cost(
    histogram: dict[int, int], seq_lens: tuple[int, ...], budget: int, batch: int, costs: Costs = ASSUMED, seed: int = 0
) -> dict:
    """Computed tokens per real token, model calls per batch, and their cost (`costs.call`) per real
    token, packing 200 seeded batches of `batch` texts drawn from the histogram with `budget`."""
    rng = random.Random(seed)
    lengths, counts = zip(*sorted(histogram.items()), strict=True)
    grid = BucketPlan(seq_lens, BucketConfig().batch_sizes, "all")
    real = computed = calls = cost = 0
    batches = 200
    for _ in range(batches):
        sample = [min(length, seq_lens[-1]) for length in rng.choices(lengths, counts, k=batch)]
        groups = [call.group for call in Layout(budget).calls(sample, grid)]  # as the request path packs
        real, computed, calls = real + sum(sample), computed + group_tokens(groups), calls + len(groups)
        cost += sum(costs.call(group.batch_size, group.seq_len) for group in groups)
    return {
        "pack_tokens": budget,
        "padded_ratio": computed / real,
        "calls_per_batch": calls / batches,
        "cost_per_real_token": cost / real,
    }


def plan_pack_budget(
    histogram: dict[int, int], seq_lens: tuple[int, ...], batch: int, costs: Costs = ASSUMED
) -> tuple[int, list[dict]]:
    """The cheapest budget among the buckets (up to AUTO_BUDGET unless the costs were measured, which
    price a long row's attention), and every candidate's figures."""
    candidates = [length for length in seq_lens if costs.measured or length <= AUTO_BUDGET] or [seq_lens[0]]
    rows = [pack_cost(histogram, seq_lens, budget, batch, costs) for budget in candidates]
    return min(rows, key=lambda row: row["cost_per_real_token"])["pack_tokens"], rows


def read_lengths(path: Path, model: str | None) -> dict[int, int]:
    """A histogram {length: count} from any of the input formats the module docstring lists."""
    text = path.read_text(errors="replace")
    if "LengthHistogram" in text:
        return read_histograms(text.splitlines(), model)
    stripped = text.strip()
    if stripped.startswith(("[", "{")):
        data = json.loads(stripped)
        if isinstance(data, dict):
            return {int(length): int(count) for length, count in data.items()}
        text = " ".join(str(value) for value in data)
    histogram: dict[int, int] = {}
    for token in text.split():
        histogram[int(token)] = histogram.get(int(token), 0) + 1
    return histogram


def compare(histogram: dict[int, int], plans: dict[str, tuple[int, ...]]) -> list[dict]:
    real = sum(length * count for length, count in histogram.items())
    rows = []
    for name, seq_lens in plans.items():
        padded = padded_tokens(histogram, seq_lens)
        rows.append({"plan": name, "seq_lens": list(seq_lens), "padded_tokens": padded, "padded_ratio": padded / real})
    return rows


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--lengths", type=Path, help="a file of lengths or a histogram (see above)")
    parser.add_argument("--log", type=Path, help="a TorchServe model_log.log with LengthHistogram lines")
    parser.add_argument(
        "--model-name",
        "--name",
        "--model",
        dest="model",
        help="with --log: the registered model whose histogram to read",
    )
    parser.add_argument("-k", type=int, default=5, help="the most buckets (each may cost a graph)")
    parser.add_argument(
        "--max-length", "--max-len", dest="max_len", type=int, help="the largest bucket (default: the longest length)"
    )
    parser.add_argument("--align", type=int, default=8, help="buckets are multiples of this (or --max-length)")
    parser.add_argument(
        "--batch-size",
        "--batch",
        dest="batch",
        type=int,
        default=build_mar.DEFAULT_MODEL_CONFIG["batchSize"],
        help="texts per batch, for the pack budget (the archive's default batchSize)",
    )
    parser.add_argument("--measure", type=Path, help="a model folder: measure its call costs, attention included")
    parser.add_argument(
        "--task", help="with --measure: the task that serves the model (default: read from its files, as build does)"
    )
    parser.add_argument("--out", type=Path, help="write the plan as JSON (build_mar.py --plan reads it)")
    args = parser.parse_args(argv)
    source = args.lengths or args.log
    if source is None or args.k < 1 or args.align < 1 or args.batch < 1:
        parser.error("give --lengths or --log; -k, --align and --batch must be >= 1")
    histogram = read_lengths(source, args.model)
    if not histogram:
        parser.error(f"no lengths found in {source}")
    task = args.task or (infer_task(args.measure) if args.measure else None)
    costs, samples = plan_costs.measure(args.measure, task) if args.measure else (ASSUMED, [])
    max_len = args.max_len or aligned(max(histogram), args.align, math.inf)
    chosen = plan(histogram, args.k, max_len, args.align, costs)
    rows = compare(histogram, {"planned": chosen, "powers of two (auto)": doubling(max_len)})
    budget, packs = plan_pack_budget(histogram, chosen, args.batch, costs)
    texts = sum(histogram.values())
    result = {"seq_lens": list(chosen), "pack_tokens": budget, "k": args.k, "align": args.align, "texts": texts}
    result["call_tokens"] = scheduler_budget(chosen, budget)
    result |= {"comparison": rows, "pack_budgets": packs, "costs": dataclasses.asdict(costs), "timed": samples}
    report(result, histogram, args.batch)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
    return result


def scheduler_budget(seq_lens: tuple[int, ...], pack_tokens: int) -> int:
    """`scheduler.call_tokens: auto` for an archive built with this plan and the default grid."""
    grid = BucketPlan(tuple(seq_lens), BucketConfig().batch_sizes, "all", pack_tokens, AUTO_MAX_TOKENS)
    return grid.full_call_tokens


def report(result: dict, histogram: dict[int, int], batch: int) -> None:
    costs = result["costs"]
    how = "measured" if costs["measured"] else "assumed"
    print(
        f"{result['texts']} texts, lengths {min(histogram)}..{max(histogram)}, k={result['k']}, align={result['align']}"
    )
    attention = f"attention {costs['per_square']:.2e} per token x length"
    print(f"costs ({how}): {costs['per_call']:.0f} tokens per call, {attention}")
    print(f"{'plan':<20} {'padded / real':>13}  seq_lens")
    for row in result["comparison"]:
        print(f"{row['plan']:<20} {row['padded_ratio']:>13.3f}  {row['seq_lens']}")
    print(f"pack budget for batches of {batch} texts: {result['pack_tokens']} tokens")
    print(f"token scheduler's call budget (asyncCommunication: true, call_tokens auto): {result['call_tokens']} tokens")
    print(f"{'budget':>7} {'padded / real':>13} {'calls / batch':>13} {'cost / real token':>17}")
    for row in result["pack_budgets"]:
        print(
            f"{row['pack_tokens']:>7} {row['padded_ratio']:>13.3f} {row['calls_per_batch']:>13.2f} "
            f"{row['cost_per_real_token']:>17.3f}"
        )


if __name__ == "__main__":
    main()
