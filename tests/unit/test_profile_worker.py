"""The worker profile's attribution of sampled stacks to components (benchmarks/profile_worker.py),
on stacks shaped as py-spy writes them from a TorchServe worker."""

import pytest

from ts_compiled_handlers.benchmarks.profile_worker import LOGGING, OTHER, component_of, contenders_on, read_samples


def stack(*frames: str) -> str:
    """py-spy's raw stack of `function file` frames, root first."""
    return ";".join(f"{frame.split()[0]} ({frame.split()[1]}:1)" for frame in frames)


OURS = "ts_compiled_handlers/"
ROOT = ("<module> ts/model_service_worker.py", "handle_connection ts/model_service_worker.py")
HANDLE = (*ROOT, "Service.predict ts/service.py", f"handle {OURS}torchserve.py")
RUN = (*HANDLE, f"Worker.run {OURS}worker.py")
ACCEPT = (*HANDLE, f"RequestReader.accept {OURS}worker/reading.py")
REPLY = (*HANDLE, f"Worker.reply {OURS}worker.py")


@pytest.mark.parametrize(
    ("frames", "component"),
    [
        ((*RUN, f"Engine.run {OURS}engine.py", f"CompiledModel.__call__ {OURS}compiling.py", "forward torch/nn/m.py"),
         "model call"),
        ((*RUN, f"Engine.run {OURS}engine.py", f"ModelRunner.__call__ {OURS}model_runner.py",
          f"PackedModel.forward {OURS}packing.py", "CompiledFxGraph.__call__ torch/_inductor/output_code.py"),
         "model call"),
        ((*RUN, f"Engine.run {OURS}engine.py", f"call_inputs {OURS}layout.py"), "layout and inputs"),
        ((*ACCEPT, f"read_request {OURS}protocols/__init__.py", "loads json/__init__.py"), "body decoding"),
        ((*ACCEPT, f"TextTokenizer.__call__ {OURS}tokenizing.py", "__call__ transformers/tokenization_utils.py"),
         "tokenization"),
        ((*REPLY, f"as_json {OURS}worker.py", "dumps json/__init__.py"), "JSON"),
        ((*REPLY, f"Worker.respond {OURS}worker.py", f"EmbeddingTask.answer {OURS}tasks/embedding.py"), "answers"),
        ((*REPLY, f"PlainProtocol.encode {OURS}protocols/plain.py"), "answers"),
        ((*RUN, f"TorchServeSink.gauge {OURS}ts_metrics.py", "CachingMetric.emit ts/metrics/caching_metric.py",
          "Logger.info logging/__init__.py"), "metrics"),
        ((*RUN, f"Worker.follow_worker_count {OURS}worker.py"), "other (ours)"),
        ((*ROOT, "retrieve_msg ts/protocol/otf_message_handler.py", "loads json/__init__.py"), "TorchServe messages"),
        ((*ROOT, "retrieve_msg ts/protocol/otf_message_handler.py", "info logging/__init__.py"), LOGGING),
        (("<module> runpy.py", "run threading.py"), OTHER),
    ],
)  # fmt: skip
def test_a_sample_goes_to_the_frame_of_ours_or_torchserve_s_nearest_its_leaf(frames, component):
    assert component_of(stack(*frames)) == component


def test_raw_output_is_counted_per_component():
    raw = f"{stack(*REPLY, f'as_json {OURS}worker.py')} 7\n{stack(*ROOT, 'recv socket.py')} 3\nnot a sample\n"
    assert read_samples(raw) == {"JSON": 7, "TorchServe messages": 3}


def test_with_several_allocators_this_trees_archive_runs_on_each_and_the_baseline_on_the_first():
    servers = {"system": "glibc server", "auto": "tcmalloc server"}
    archives = {"9221d4a": "batches-9221d4a", "HEAD": "batches"}
    assert contenders_on(servers, archives) == {
        "9221d4a@system": ("glibc server", "batches-9221d4a"),
        "HEAD@system": ("glibc server", "batches"),
        "HEAD@auto": ("tcmalloc server", "batches"),
    }
    assert contenders_on({"auto": "server"}, archives) == {
        "9221d4a": ("server", "batches-9221d4a"),
        "HEAD": ("server", "batches"),
    }


def test_this_trees_archive_and_the_baselines_take_the_same_batch_size(monkeypatch, tmp_path):
    """So that the profile compares the code, whatever the archives' default batchSize is now."""
    from argparse import Namespace

    from ts_compiled_handlers.benchmarks import profile_worker

    built = []
    monkeypatch.setattr(profile_worker.build_mar, "build", lambda *call: built.append((call[2], call[4])))
    monkeypatch.setattr(profile_worker.at_revision, "short", lambda revision: revision)
    monkeypatch.setattr(profile_worker.at_revision, "build_at", lambda *call: built.append((call[3], call[5])))
    args = Namespace(scheduled=False, batch_size=8, against="9221d4a")
    assert profile_worker.build_archives(args, tmp_path, tmp_path) == {"9221d4a": "batches-9221d4a", "HEAD": "batches"}
    assert sorted(built) == [("batches", {"batchSize": 8}), ("batches-9221d4a", {"batchSize": 8})]
