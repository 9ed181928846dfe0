"""The tiny archive of every task that tests/integration/conftest.py's shared TorchServe serves."""

SMALL_GRID = {"dtype": "float32", "buckets": {"seq_lens": [8, 32], "batch_sizes": [1, 4]}}
TASK_ARCHIVES = {  # archive name: task
    "embedder": "embedding",
    "classifier": "text-classification",
    "tagger": "token-classification",
    "generator": "text-generation",
}
