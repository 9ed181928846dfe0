"""The handler's configuration: one frozen, typed record parsed from model-config.yaml.

An archive's model-config.yaml holds TorchServe's own keys (`minWorkers`, `batchSize`,
`asyncCommunication`...), which each server reads for itself (handlers/servers/), and ours under
`handler:`, parsed here under any server, with the standard `pt2: compile:` section honoured as the
archive's compile settings. Unknown keys and bad values raise
`ConfigError` naming the key, the value and what is allowed, so `initialize` fails loudly.
Each key's meaning and the reason for its default sit beside it, once: docs/configuration.md is
generated from them (scripts/config_table.py).
"""

import dataclasses
from typing import Any

from ts_compiled_handlers.configuration import config_values as values
from ts_compiled_handlers.configuration.config_values import ConfigError
from ts_compiled_handlers.configuration.generation_config import GenerationConfig
from ts_compiled_handlers.configuration.image_config import ImagesConfig
from ts_compiled_handlers.configuration.tracing_config import TracingConfig
from ts_compiled_handlers.request.answer_budget import DEFAULT_LIMIT as DEFAULT_ANSWER_BYTES

TASKS = (
    "embedding",
    "sparse-embedding",
    "multi-vector",
    "m3-embedding",
    "image-text-embedding",
    "text-classification",
    "token-classification",
    "text-generation",
)
GENERATION = "text-generation"  # the one task that generates: it runs generation's loops, never int8
DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16")
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# Which tensor dimensions the compiled graphs treat as dynamic; see docs/design.md, "Shape strategy".
DYNAMIC = ("none", "batch", "all")
OVERFLOW = ("truncate", "reject")
PACK_ATTENTIONS = ("auto", "mask")
ON_FAILURE = ("eager", "fail")
PT2_COMPILE_KEYS = ("enable", "backend", "mode", "fullgraph", "dynamic")


_option = values.option


def _section(cls):
    """A nested section of keys (`buckets:`, `compile:`, ...), parsed by its own fields."""
    return dataclasses.field(default=cls(), metadata={"check": lambda value, key: _parse_section(cls, value, key)})


@dataclasses.dataclass(frozen=True)
class BucketConfig:
    seq_lens: str | tuple[int, ...] = _option(
        values.seq_lens,
        "auto",
        meaning="length buckets; `auto` = 16, 32, 64, ... doubling up to the model's own limit (sentence-transformers' "
        "`max_seq_length`, else the tokenizer's `model_max_length`, else its position table), the limit the "
        "largest; text generation: up to 256 prompt tokens; a list is capped at the limit",
        why="each bucket twice the one below, so a text over 16 tokens is padded to less than twice its length, and "
        "every text up to the model's limit is answered whole, as its reference library answers it; re-plan with "
        "`hfserve plan`",
    )
    batch_sizes: tuple[int, ...] = _option(
        values.sorted_ints,
        (1, 2, 4, 8),
        meaning="batch buckets warmed; the largest is the most rows per call",
        why="8 packed rows of 256 tokens hold the archive's default `batchSize` (32) of texts of the load test's "
        "traffic (median 30 tokens) in one call; length groups answer a larger batch in calls of 8; text "
        "generation's decode slots",
    )
    max_tokens: str | int = _option(
        values.auto_or_positive,
        "auto",
        meaning="the most tokens (rows x length) one model call holds: the long buckets of a long-context model "
        "take fewer rows (at least one); `auto` = 4096",
        why="bounds a call's memory and a warm-up shape's time as the limit grows (attention is quadratic in length); "
        "the default grid up to 256 tokens is not cut by it",
    )
    overflow: str = _option(
        values.choice(*OVERFLOW),
        "truncate",
        meaning="a text over the largest bucket: `truncate` it, or `reject` it with 413",
        why="what sentence-transformers' `encode` does",
    )
    pack_tokens: str | int = _option(
        values.pack_tokens,
        "auto",
        meaning="encoder tasks: a batch's texts are packed end to end into rows of at most this many tokens "
        "([Packing](design.md#packing)); `auto` = the largest length bucket, at most 256; "
        "`off` = length groups; a number = that budget (`hfserve plan` plans one)",
        why="256-token rows were the fastest budget on MiniLM's traffic (1.13 computed tokens per real one, "
        "1.40x the length groups; [Packing](performance.md#packing))",
    )
    pack_attention: str = _option(
        values.choice(*PACK_ATTENTIONS),
        "auto",
        meaning="packed rows' attention on the CPU: `auto` = each text against its own tokens only (the "
        "`hfserve::text_attention` operator, built once per host; SDPA with the block mask where it cannot be "
        "built or its answers differ from each text's alone); `mask` = SDPA over the whole row with the "
        "block-diagonal mask",
        why="SDPA computes every score of a packed row and the mask discards the pairs across texts (73% on the "
        "load test's traffic); per text, the same answers for a fraction of the work "
        "([Per-text attention](performance.md#per-text-attention))",
    )
    histogram_every: int = _option(
        values.positive_int,
        1000,
        meaning="log the histogram of live token lengths every this many texts (for `plan_buckets.py --log`)",
        why="about one line per 12 s at the 87 requests/s of the MiniLM soak run, not one per request",
    )


@dataclasses.dataclass(frozen=True)
class CompileConfig:
    enable: bool = _option(
        values.boolean,
        True,
        meaning="`false` serves eagerly (the switch that turns compilation off)",
        why="compiled matched or beat eager per call at every shape measured "
        "(see [Per bucket](performance.md#per-bucket))",
    )
    backend: str = _option(
        values.backend,
        "inductor",
        meaning="the `torch.compile` backend",
        why="torch's own compiler; AOT packages need it",
    )
    mode: str = _option(
        values.choice(*MODES),
        "default",
        meaning="the `torch.compile` mode: default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs",
        why="`default` compiles fastest; the others trade longer compiles for speed "
        "(see [Tuning](operations.md#tuning))",
    )
    freezing: bool | None = _option(
        values.auto_boolean,
        None,
        meaning="inductor's `freezing`: the weights become constants of the graph, folded and, on CPU, "
        "prepacked for oneDNN; `auto` = on where the whole model is compiled on the CPU (not `regional`, not "
        "text generation)",
        why="on the CPU it halves MiniLM's float32 call and takes a quarter off its bfloat16 1x16 call; it keeps "
        "a packed copy of the weights beside the model's (see [Small shapes](performance.md#small-shapes))",
        shown="`auto`",
    )
    fullgraph: bool = _option(
        values.boolean,
        False,
        meaning="passed to `torch.compile`: `true` makes a graph break an error",
        why="a model with graph breaks still compiles, in pieces; warm-up counts its graphs per shape",
    )
    dynamic: str = _option(
        values.choice(*DYNAMIC),
        "all",
        meaning="which dims the graphs treat as dynamic: `none`, `batch`, `all` "
        "(see [Shape strategy](design.md#shape-strategy))",
        why="one graph for the whole grid: the only strategy that starts in a minute on 2 cores",
    )
    regional: bool = _option(
        values.boolean,
        False,
        meaning="compile the repeated transformer block instead of the whole model",
        why="~30% less compile time here, but no faster than eager (see [Compile policy](design.md#compile-policy))",
    )
    on_failure: str = _option(
        values.choice(*ON_FAILURE),
        "eager",
        meaning="a compile or verify failure: serve `eager`ly (logged loudly, `CompileFallback 1`), "
        "or `fail` the worker (registration fails fast)",
        why="a slower answer beats no answer; choose `fail` where speed is part of the contract",
    )
    cache_dir: str = _option(
        values.cache_dir,
        "auto",
        meaning="where the workers of a host share compiled kernels (handlers/compiling/compile_cache.py): "
        "`auto` = `$HFSERVE_CACHE_DIR` (`off` there turns it off host-wide), else "
        "`<tmp>/hfserve-<uid>/compile-cache`; an absolute path; `off` leaves inductor's own cache alone",
        why="a restarted or added worker loads instead of compiling",
    )


@dataclasses.dataclass(frozen=True)
class WarmupConfig:
    iterations: int = _option(
        values.positive_int,
        2,
        meaning="calls per grid shape during warm-up",
        why="the first call compiles, the second proves the graph is reused",
    )
    verify: bool = _option(
        values.boolean,
        True,
        meaning="compare compiled with eager, and `auto` dtype with float32",
        why="a wrong answer must not go live",
    )
    tolerance: float | None = _option(
        values.tolerance,
        None,
        shown="`auto`",
        meaning="largest allowed 1 - cosine; auto = 1e-4 (float32), 2e-3 (bf16/fp16); with `quantize`, "
        "also the int8 gate's allowance (`auto`: 0.01), so raising it for int8 loosens every check",
        why="what MiniLM and the test models pass in each dtype (the test suite runs with it)",
    )


@dataclasses.dataclass(frozen=True)
class EmbeddingConfig:
    """embedding only."""

    dimensions: str = _option(
        values.choice("auto", "any"),
        "auto",
        meaning="embedding: which models take a request's `dimensions` (the first N values, then normalized): "
        "`auto` = those whose config.json says they were trained for it (`matryoshka_dimensions`, "
        "`is_matryoshka`), `any` = every model",
        why="a model not trained for it (Matryoshka) loses meaning when cut; vLLM refuses it the same way",
    )
    embed_all: bool = _option(
        values.boolean,
        False,
        meaning="embedding: the graph answers each token's last hidden state, so TEI's `embed_all` is served; "
        "embeddings are pooled from those states after the call",
        why="off by default: a graph that pools inside hands out a vector per text, not per token",
    )


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    """encoder tasks under `asyncCommunication: true` (handlers/loops/token_scheduler.py)."""

    call_tokens: str | int = _option(
        values.auto_or_positive,
        "auto",
        meaning="with `asyncCommunication: true` (encoder tasks): the most tokens of waiting requests one model "
        "call takes (the oldest request always goes); "
        "`auto` = the largest batch bucket x the pack budget (length groups: x the largest length bucket), "
        "within `buckets.max_tokens`; `hfserve plan` plans the grid it follows",
        why="one call of the warmed grid's largest rows: every shape it makes is warmed, and a call is never "
        "longer than a full request batch was",
    )
    max_queue: int = _option(
        values.positive_int,
        100,
        meaning="with `asyncCommunication: true`: requests a worker holds (queued or in a call); one more is "
        "answered 503 at once",
        why="TorchServe's own `job_queue_size` default: a backlog is refused, never grown without bound",
    )
    fill_ms: int = _option(
        values.non_negative_int,
        5,
        meaning="with `asyncCommunication: true`: under load (requests waited through the call just made), the "
        "most milliseconds the next call waits for as many more requests as that call took (their clients, "
        "answered, send again) or a full token budget; a call that starts an idle engine never waits; 0 = never",
        why="fewer, fuller calls: 1.14x the requests/s at 16 clients and 1.12x at 32 (MiniLM, 2 cores), a lone "
        "query's p50 unchanged; 5 ms, as `maxBatchDelay`",
    )


@dataclasses.dataclass(frozen=True)
class HandlerConfig:
    task: str = _option(
        values.choice(*TASKS),
        "embedding",
        meaning=f"which handler serves the model: {', '.join(TASKS)}",
        why="the demo model is a sentence embedder; `hfserve build --task` sets it",
    )
    dtype: str = _option(
        values.choice(*DTYPE_NAMES),
        "auto",
        meaning="`auto` = bfloat16 on CUDA >= 8.0 or CPUs with AMX/AVX512-BF16, float16 on older CUDA, else "
        "float32; refused back to float32 if it drifts past the tolerance",
        why="the fastest type the hardware computes natively, never at a cost in answers the check can see",
    )
    threads: int | None = _option(
        values.threads,
        None,
        shown="`auto`",
        meaning="intra-op threads per worker; `auto` = cores / the model's live workers (at least `minWorkers`), "
        "followed as workers come and go; a number is kept whatever the worker count",
        why="workers of one host must not oversubscribe the cores",
    )
    max_inputs: int = _option(
        values.positive_int,
        64,
        meaning="texts per request (a longer list gets 413)",
        why="bounds what one request can make a worker hold",
    )
    max_response_bytes: int = _option(
        values.positive_int,
        DEFAULT_ANSWER_BYTES,
        meaning="the most bytes of JSON one request is answered with: a larger answer gets 413 naming what to send "
        "instead (fewer texts, `top_k`...), refused before it is made where its size follows from the request "
        "(tokens, texts x dimensions); keep it under TorchServe's `max_response_size`",
        why="6 MiB, under TorchServe's own default `max_response_size` (6.5 MB; 32 MiB in our config.properties), "
        "past which the frontend drops the worker's connection and its whole batch fails; 64 texts of a "
        "4096-wide embedding take ~3 MB, of a SPLADE model ~6 MB in TEI's form",
    )
    max_held_bytes: int = _option(
        values.positive_int,
        1 << 30,
        meaning="the most bytes of per-token output rows (bge-m3's outputs, ColBERT's vectors, `embed_all`'s "
        "states, token labels) a worker holds for requests computed and not yet answered, over a batch or the "
        "queue: a request that alone passes it gets 413 before it is queued, one that fits later 503",
        why="per-token rows grow with the tokens sent (64 bge-m3 texts of 8190 tokens: 4.3 GB); 1 GiB holds 16 "
        "such texts, and pooled tasks hold a vector per text only, so it never refuses them",
    )
    cache_bytes: int = _option(
        values.non_negative_int,
        0,
        meaning="the most bytes of model output rows kept for texts seen before (least recently used out): a "
        "repeated text, or one repeated within a call, is answered from its rows, not computed again (encoders; "
        "keyed by its token ids, so every request parameter still applies); 0 = off",
        why="a cache costs memory every worker holds, worth it only where texts repeat (re-indexing, RAG); "
        "off until asked for",
    )
    adapters: tuple[str, ...] = _option(
        values.adapter_names,
        (),
        shown="`[]`",
        meaning="LoRA adapters served beside the base model (encoder tasks but images): each a PEFT folder in the "
        "archive under `adapters/NAME/` (`hfserve build --adapter NAME=DIR`); a request names one (`adapter`, "
        "OpenAI's `model: ARCHIVE:NAME`) or none (the base model), and a batch that mixes them runs in one call",
        why="one server for every tenant's or task's fine-tune of one base model, at the cost of its adapters' "
        "low-rank products on every call ([Adapters](tasks.md#lora-adapters))",
    )
    quantize: str = _option(
        values.choice("none", "int8", "int8-all", "auto"),
        "none",
        meaning="`int8`: the encoder's linears in int8 through PT2E (dynamic activations, 7-bit where the CPU lacks "
        "VNNI; 8-bit per-channel weights) but the fewest that must stay in floating point for the gate to pass, "
        "found by simulating int8 over the calibration texts (MiniLM keeps 3 of 36; refused where more than a third "
        "of the weights would stay), what is not int8 at the model's `dtype` (bfloat16 under autocast where it is "
        "bfloat16); `int8-all`: every linear in int8, no search (MiniLM's least cosine 0.988, refused at the "
        "default tolerance); both experimental: "
        "refused (then `compile.on_failure`) where its answers on the calibration texts drift from float32's "
        "past its gate (per-text cosine, per token for ColBERT and bge-m3, `1 - warmup.tolerance`, 0.99 by "
        "default; `agreement` for classifiers, taggers and rerankers); `auto`: int8 where the CPU has VNNI or "
        "AMX and the gate passes, else the model as it is; `hfserve build --precompile aot` packs the int8 "
        "model (frozen, weights inside, gated again at start); CPU only, needs torchao "
        "(`pip install ts-compiled-handlers[int8]`)",
        why="int8 trades answers for speed, a trade each model must pass: off until asked for",
    )
    smoothing: float = _option(
        values.fraction,
        0.6,
        meaning="SmoothQuant's alpha for `quantize`: before quantizing, each int8 linear's input channels are "
        "divided by `max|x|^alpha / max|w|^(1-alpha)` (measured on the calibration texts) and its weight's "
        "columns multiplied by it, the same product with the activations' outlier channels moved into the "
        "per-channel weights; 0 turns it off",
        why="MiniLM's least cosine to float32 on the calibration texts, compiled beside bfloat16, went from 0.982 to "
        "0.998 with its residual projections kept in floating point and from 0.960 to 0.988 with none kept "
        '(`int8-all`); 0.6 measured best of 0.5-0.8 (docs/performance.md, "int8")',
    )
    agreement: float = _option(
        values.share,
        0.95,
        meaning="the `quantize` gate's floor for classifiers, taggers and one-score rerankers: the least share of "
        "calibration texts (tokens, for taggers) whose best label int8 keeps, or of calibration pairs whose "
        "order of scores it keeps (every two pairs compared); 1 asks for no change at all",
        why="a label flip or a swapped pair is a changed answer, yet a near-tie may swap under any rounding: "
        "bfloat16 alone kept 99.4% of the pairs' order of a distilled MiniLM reranker, int8 97.0% "
        '(docs/performance.md, "int8")',
    )
    calibration: str = _option(
        values.archive_file,
        "default",
        meaning="the texts `quantize: int8` is held against float32 on: `default`, a varied set shipped in the "
        "package (handlers/quantizing/calibration.py), or a file of the archive, one text a line "
        "(`hfserve build --calibration FILE` puts it there); a reranker is calibrated and gated on pairs, as it "
        "serves: each text beside the one half the set on, or a file's own pairs where every line is "
        "`query<TAB>document`",
        why="a gate on real texts meets the model's outliers (long texts, rare tokens) before traffic does; "
        "random token ids miss them",
    )
    buckets: BucketConfig = _section(BucketConfig)
    compile: CompileConfig = _section(CompileConfig)
    warmup: WarmupConfig = _section(WarmupConfig)
    embedding: EmbeddingConfig = _section(EmbeddingConfig)
    generation: GenerationConfig = _section(GenerationConfig)
    scheduler: SchedulerConfig = _section(SchedulerConfig)
    images: ImagesConfig = _section(ImagesConfig)
    tracing: TracingConfig = _section(TracingConfig)


def _parse_section(cls, raw: Any, key: str):
    if raw is None:
        raw = {}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if not isinstance(raw, dict):
        raise ConfigError(key, raw, f"a mapping with keys {', '.join(fields)}")
    for name in raw:
        if name not in fields:
            raise ConfigError(f"{key}.{name}", raw[name], f"one of the keys {', '.join(fields)}")
    values = {name: fields[name].metadata["check"](value, f"{key}.{name}") for name, value in raw.items()}
    return cls(**values)


def _pt2_compile(yaml_config: dict) -> dict:
    """TorchServe's `pt2: compile:` section as keys of our `compile:` section."""
    pt2 = yaml_config.get("pt2")
    if pt2 is None:
        return {}
    section = pt2.get("compile") if isinstance(pt2, dict) else None
    if not isinstance(section, dict):
        raise ConfigError("pt2", pt2, "a mapping with a compile: section")
    for name, value in section.items():
        if name not in PT2_COMPILE_KEYS:
            raise ConfigError(f"pt2.compile.{name}", value, f"one of the keys {', '.join(PT2_COMPILE_KEYS)}")
    merged = dict(section)
    if "dynamic" in merged:
        merged["dynamic"] = "all" if values.boolean(merged["dynamic"], "pt2.compile.dynamic") else "none"
    return merged


def parse(yaml_config: dict | None) -> HandlerConfig:
    """The HandlerConfig for a model-config.yaml; `handler.compile` wins over `pt2.compile`."""
    yaml_config = yaml_config or {}
    handler = yaml_config.get("handler") or {}
    if not isinstance(handler, dict):
        raise ConfigError("handler", handler, "a mapping")
    own_compile = handler.get("compile") or {}
    if isinstance(own_compile, dict):
        own_compile = {**_pt2_compile(yaml_config), **own_compile}
    config = _parse_section(HandlerConfig, {**handler, "compile": own_compile}, "handler")
    if config.quantize != "none" and config.task == GENERATION:
        raise ConfigError("handler.quantize", config.quantize, f"none for {GENERATION} (int8 serves encoders)")
    if config.cache_bytes and config.task == GENERATION:
        raise ConfigError("handler.cache_bytes", config.cache_bytes, f"0 for {GENERATION} (the cache serves encoders)")
    if config.adapters and (config.task in (GENERATION, "image-text-embedding") or config.quantize != "none"):
        allowed = "[] with this task or with quantize (adapters serve text encoders in floating point)"
        raise ConfigError("handler.adapters", list(config.adapters), allowed)
    if config.quantize != "none" and config.compile.regional:
        raise ConfigError("handler.compile.regional", True, "false with quantize (the int8 graph has no blocks)")
    if (config.generation.default_new_tokens or 0) > config.generation.max_new_tokens:
        raise ConfigError(
            "handler.generation.default_new_tokens",
            config.generation.default_new_tokens,
            f"at most generation.max_new_tokens ({config.generation.max_new_tokens})",
        )
    return config
