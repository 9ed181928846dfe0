"""The archives that tests/integration/conftest.py's shared TorchServe serves."""

SMALL_GRID = {"dtype": "float32", "buckets": {"seq_lens": [8, 32], "batch_sizes": [1, 4]}}
TASK_ARCHIVES = {  # archive name: task (its model: the task's tiny model)
    "embedder": "embedding",
    "classifier": "text-classification",
    "tagger": "token-classification",
    "generator": "text-generation",
    "sparse-embedder": "sparse-embedding",
}
AUTO_GRID = {"buckets": {"seq_lens": "auto", "batch_sizes": [1, 4]}}  # lengths up to the model's own limit
MODEL_ARCHIVES = {  # archive name: (tiny model, task, handler settings over SMALL_GRID): the models users bring
    "long-embedder": ("embedding-long", "embedding", AUTO_GRID),
    "reranker": ("cross-encoder", "text-classification", AUTO_GRID),
    "qwen-embedder": ("embedding-decoder", "embedding", AUTO_GRID),
    "llm-reranker": ("reranker-causal", "text-classification", AUTO_GRID),
    "colbert": ("colbert", "multi-vector", {"buckets": {"seq_lens": [16, 48], "batch_sizes": [1, 4]}}),
    "m3": ("m3", "m3-embedding", {"buckets": {"seq_lens": [16, 128], "batch_sizes": [1, 4]}}),
}
# Built with `--precompile aot`: served from the archive's AOTInductor package, nothing compiled.
AOT_ARCHIVES = {
    "sparse-embedder-aot": ("sparse-embedding", "sparse-embedding", AUTO_GRID),
    "llm-reranker-aot": ("reranker-causal", "text-classification", AUTO_GRID),
}
# The documentation's own archives, where no test above serves one under that name: served eagerly
# (the examples' answers do not depend on compilation), not on SMALL_GRID (a model `minilm` is
# MiniLM itself, not a tiny model).
EAGER = {"compile": {"enable": False}, "buckets": {"seq_lens": [16, 64], "batch_sizes": [1, 8]}}
DOCUMENTED_ARCHIVES = {
    "minilm": ("minilm", "embedding", EAGER),
    # docs/tasks.md's embed_all example: MiniLM keeping its token states
    "minilm-states": ("minilm", "embedding", {**EAGER, "embedding": {"embed_all": True}}),
    "clip": ("image-text-embedding", "image-text-embedding", EAGER),
}

# A CLIP whose processor works at 224 pixels, as CLIP's does, under image budgets small enough that
# the hostile inputs of tests/integration/test_hostile_images_server.py pass them; `fetch_from` is
# the run's picture server (tests/image_server.py), known only once it listens.
GUARDED_IMAGES = {
    "max_pixels": 4_000_000,
    "request_pixels": 8_000_000,
    "request_bytes": 2 << 20,
    "batch_images": 64,
    "max_scans": 3,
    "max_urls": 4,
    "fetch_seconds": 2,
}
IMAGE_ARCHIVES = {  # archive name: (tiny model, task, handler settings)
    "clip-guarded": (
        "image-text-embedding-224",
        "image-text-embedding",
        {**EAGER, "dtype": "float32", "images": GUARDED_IMAGES},
    ),
}

# An embedder whose worker sends its request spans to the run's OTLP endpoint (tests/otlp_receiver.py),
# known only once it listens; eager, as the spans do not depend on compiling.
TRACED_ARCHIVES = {"traced-embedder": ("embedding", "embedding", EAGER)}

# Archives with two LoRA adapters each (tests/lora_reference.py makes them with PEFT): the embedder
# compiled on the small grid (no mix of adapters may compile anything), the cross-encoder eager.
LORA_ARCHIVES = {  # archive name: (which of lora_reference's models, task, handler settings)
    "lora-embedder": ("embedder", "embedding", SMALL_GRID),
    "lora-ranker": ("ranker", "text-classification", {**EAGER, "dtype": "float32"}),
}
