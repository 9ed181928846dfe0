"""Smoke runs of the benchmarks and the load test: they work end to end, on the tiny model, and what
they report is consistent. No speed is asserted here (docs/performance.md has the runs). Six minutes
of a 2-core machine: scripts/release_check.sh runs them (`pytest --release -m release`), before a
release and whenever a benchmark or the load test changes; the test command deselects them."""

import json

import pytest

from ts_compiled_handlers.benchmarks import (
    benchmark,
    benchmark_adapters,
    benchmark_aot,
    benchmark_chunking,
    benchmark_images,
    benchmark_small_shapes,
    benchmark_sparse,
    loadtest,
)
from ts_compiled_handlers.benchmarks.anchor_runtimes import ANCHORS
from ts_compiled_handlers.benchmarks.loadtest_kinds import KINDS
from ts_compiled_handlers.scripts import plan_buckets

pytestmark = [pytest.mark.integration, pytest.mark.release]


def test_benchmark_quick_reports_every_bucket_with_correctness(tmp_path):
    out = tmp_path / "benchmark.json"
    benchmark.main(["--quick", "--out", str(out)])
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert {(row["batch"], row["seq_len"]) for row in rows} == {(1, 16), (4, 16), (1, 32), (4, 32)}
    for row in rows:
        assert row["eager"]["count"] == row["compiled"]["count"] == 10
        assert row["vs_eager_float32"]["min_cosine"] > 0.9999  # float32 compiled vs float32 eager
        assert row["recompiles_after_ready"] == 0
        assert row["flops"] > 0 and 0 < row["fraction_of_matmul_ceiling"]
    assert result["ceilings"]["float32"] > 0
    assert (tmp_path / "benchmark.png").stat().st_size > 0


def test_benchmark_adapters_quick_times_the_base_and_the_adapted_archive_on_one_traffic(tmp_path):
    out = tmp_path / "adapters.json"
    result = benchmark_adapters.main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert [row["contender"] for row in result["rows"]] == ["base", "adapted, base traffic", "adapted, mix"]
    assert result["rows"][0]["over_base"] == 1.0 and all(row["texts_per_s"] > 0 for row in result["rows"])
    assert result["texts"] == 64 and result["recompiles_after_ready"] == 0


def test_benchmark_aot_quick_times_every_bucket_of_the_three_contenders(tmp_path):
    out = tmp_path / "benchmark_aot.json"
    benchmark_aot.main(["--quick", "--out", str(out)])
    result = json.loads(out.read_text())
    assert {(row["batch"], row["seq_len"]) for row in result["rows"]} == {(1, 8), (4, 8), (1, 32), (4, 32)}
    for row in result["rows"]:
        assert row["eager_ms"] > 0 and row["compiled_ms"] > 0 and row["aot_ms"] > 0
        assert row["aot_vs_eager"]["min_cosine"] > 0.9999
    assert result["recompiles_after_ready"] == 0 and result["built"]["package_megabytes"] > 0


def test_benchmark_small_shapes_quick_times_ours_int8_and_every_anchor_and_profiles_ours(tmp_path):
    out = tmp_path / "small_shapes.json"
    names = ["compiled", "int8", *ANCHORS]
    benchmark_small_shapes.main(["--quick", "--contenders", *names, "--profile", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["contenders"] == names and result["recompiles_after_ready"] == 0  # the anchors installed
    for row in result["rows"]:
        assert all(row[f"{name}_ms"] > 0 and row[f"{name}_min_cosine"] > 0.99 for name in names)
        assert row["onnxruntime_vs_baseline"] == 1.0
    assert list(result["profiles"]) == ["compiled", "int8"] and result["profiles"]["int8"][0]["ms_per_call"] > 0


def test_loadtest_quick_serves_the_other_outputs_as_contenders_of_their_own(tmp_path, compile_cache):
    out = tmp_path / "loadtest.json"
    contenders = ["ours-float32", *KINDS]
    loadtest.main(["--quick", "--contenders", *contenders, "--inductor-cache", compile_cache, "--out", str(out)])
    rows = {row["contender"]: row for row in json.loads(out.read_text())["rows"]}
    assert list(rows) == contenders
    for name, row in rows.items():
        assert row["ok"] == row["requests"] > 0 and row["errors"] == row["lost"] == 0, name
        assert row["recompiles_after_ready"] == 0 and row["padded_token_ratio"] >= 1.0, name
    # their answers are not dense vectors: held against ours-float32's, not one of them is
    assert [name for name, row in rows.items() if "min_cosine_vs_ours-float32" in row] == ["ours-float32"]


def test_loadtest_quick_serves_the_image_mix_to_ours_and_the_stock_clip_handler(tmp_path, compile_cache):
    out = tmp_path / "loadtest.json"
    contenders = ["ours-images", "stock-images"]
    loadtest.main(["--quick", "--contenders", *contenders, "--inductor-cache", compile_cache, "--out", str(out)])
    rows = {row["contender"]: row for row in json.loads(out.read_text())["rows"]}
    for name, row in rows.items():
        assert row["ok"] == row["requests"] > 0 and row["errors"] == row["lost"] == 0, name
    assert rows["ours-images"]["recompiles_after_ready"] == 0
    assert rows["stock-images"]["min_cosine_vs_ours-images"] > 0.999  # the same vectors, picture and text


def test_benchmark_sparse_quick_serves_every_contender_and_measures_a_full_call(tmp_path):
    out = tmp_path / "benchmark_sparse.json"
    benchmark_sparse.main(["--quick", "--runs", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["texts"] == 64 and result["multi-vector_vs_dense"] > 0
    contenders = ("dense", "sparse", "multi-vector", "m3 dense+sparse", "m3 all three")
    assert all(result[f"{name}_texts_per_s"] > 0 for name in contenders)
    memory = result["memory"]
    assert memory["shape"] == "4x64" and memory["slices"] >= 1
    assert memory["sparse_sliced_mib"] >= 0 and memory["sparse_unsliced_eager_mib"] >= 0


def test_benchmark_images_quick_times_the_vision_tower_at_every_batch(tmp_path):
    out = tmp_path / "benchmark_images.json"
    benchmark_images.main(["--quick", "--out", str(out)])
    result = json.loads(out.read_text())
    assert [row["batch"] for row in result["rows"]] == [1, 4]
    assert all(row["eager"] > 0 and row["compiled"] > 0 and row["aot"] > 0 for row in result["rows"])
    assert result["read_one_image_ms"] > 0
    least = result["least_cosine_to_float32"]  # bfloat16 where auto picks it, else float32
    assert set(least) == {"compiled", "aot"} and min(min(kind.values()) for kind in least.values()) >= 0.999


def test_benchmark_chunking_quick_cuts_every_document_and_sizes_every_precision(tmp_path):
    out = tmp_path / "benchmark_chunking.json"
    benchmark_chunking.main(["--quick", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["documents"] == 8 and result["chunks"] > result["documents"]  # documents past 48 tokens cut
    assert result["chunked_tokens_per_s"] > 0 and result["as_texts_tokens_per_s"] > 0
    sizes = result["answer_bytes"]
    assert set(sizes) == {"float32", "int8", "uint8", "binary", "ubinary", "base64 (OpenAI)"}
    assert sizes["binary"] < sizes["int8"] < sizes["float32"] and sizes["ubinary"] < sizes["uint8"]


def test_loadtest_quick_answers_every_request_of_every_contender(tmp_path, compile_cache):
    out = tmp_path / "loadtest.json"
    # Every kind of contender once: the -auto twins differ only in dtype (auto is served through
    # TorchServe by the MiniLM archives of test_embedding_server). The run's inductor cache is shared.
    contenders = ["ours-aot", "ours-float32", "groups-float32", "eager-longest", "stock"]
    loadtest.main(["--quick", "--contenders", *contenders, "--inductor-cache", compile_cache, "--out", str(out)])
    result = json.loads(out.read_text())
    rows = {row["contender"]: row for row in result["rows"]}
    assert set(rows) == set(contenders)
    for name, row in rows.items():
        assert row["ok"] == row["requests"] > 0, name
        assert row["errors"] == row["lost"] == 0, name
        assert row["min_cosine_vs_ours-float32"] > 0.999, name  # same answers, whatever the padding
    for name in ("ours-aot", "ours-float32"):
        assert rows[name]["recompiles_after_ready"] == 0
        assert rows[name]["padded_token_ratio"] >= 1.0
    assert rows["stock"]["recompiles_after_ready"] is None  # the stock handler exports no such metric
    assert any(check["check"] == "lost requests, all contenders" and check["met"] for check in result["checks"])
    assert rows["groups-float32"]["padded_token_ratio"] > rows["ours-float32"]["padded_token_ratio"]  # packing
    # The handler logged its length histogram (every 100 texts here), and the planner reads it back.
    plan = plan_buckets.main(["--log", str(tmp_path / "loadtest_logs" / "model_log.log"), "--model", "ours-float32"])
    assert plan["texts"] >= 100 and plan["seq_lens"][-1] <= 64
    assert (tmp_path / "loadtest_latency.png").stat().st_size > 0
    assert (tmp_path / "loadtest_throughput.png").stat().st_size > 0
