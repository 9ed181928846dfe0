"""perf's on-CPU samples of a worker put in or outside the model (benchmarks/on_cpu.py), on stacks
shaped as `perf script -F tid,ip,sym,dso` writes them from a TorchServe worker."""

from collections import Counter

import pytest

from ts_compiled_handlers.benchmarks import on_cpu

VENV = "/venv/lib/python3.11/site-packages"
PYTHON = ("fe107 _PyEval_EvalFrameDefault (/usr/lib/libpython3.11.so.1.0)", "1080 _start (/usr/bin/python3.11)")
TORCH_PYTHON = f"b14cf3 torch::jit::invokeOperatorFromPython ({VENV}/torch/lib/libtorch_python.so)"
HOOK = f"893d4b dynamo__custom_eval_frame ({VENV}/torch/lib/libtorch_python.so)"
MATMUL = f"101915fa dnnl::impl::cpu::x64::matmul_inner_product_fwd_t::execute ({VENV}/torch/lib/libtorch_cpu.so)"


@pytest.mark.parametrize(
    ("frames", "kind"),
    [
        ((MATMUL, TORCH_PYTHON, *PYTHON[:1], HOOK, *PYTHON), on_cpu.MODEL),
        (("1e02a [unknown] (/tmp/perf-6114.map)",), on_cpu.MODEL),  # a JIT-ed kernel: unwinding stops there
        ((f"1e02a [unknown] ({VENV}/torch/lib/libgomp.so.1)", "891f4 start_thread (/lib/libc.so.6)"), on_cpu.MODEL),
        ((f"e0289e torch::utils::tensor_from_numpy ({VENV}/torch/lib/libtorch_python.so)", *PYTHON),
         on_cpu.TORCH_OUTSIDE),
        ((f"12 tokenizers::pre_tokenizers::bert::is_bert_punc ({VENV}/tokenizers/tokenizers.abi3.so)", *PYTHON),
         "tokenizer (Rust)"),
        (("5 asm_exc_page_fault ([kernel.kallsyms])", f"7 [unknown] ({VENV}/orjson/orjson.so)", *PYTHON), "orjson"),
        (("9 unix_stream_sendmsg ([kernel.kallsyms])", "3 __x64_sys_sendto ([kernel.kallsyms])", *PYTHON), "kernel"),
        (("4 _PyObject_Malloc (/usr/lib/libpython3.11.so.1.0)", *PYTHON), on_cpu.PYTHON),
    ],
)  # fmt: skip
def test_a_sample_is_in_the_model_only_under_its_compiled_region_or_in_torch_s_own_threads(frames, kind):
    assert on_cpu.kind_of(list(frames)) == kind


def test_perf_script_output_is_counted_per_sample():
    script = "\n".join(
        [" 6114 ", f"\t{MATMUL}", f"\t{HOOK}", *(f"\t{frame}" for frame in PYTHON), ""]
        + [" 6114 ", "\t4 _PyObject_Malloc (/usr/lib/libpython3.11.so.1.0)", ""]
        + [" 6128 ", "\t1e02a [unknown] (/tmp/perf-6114.map)"]  # the last sample, with no blank line after it
    )
    assert on_cpu.read_samples(script) == Counter({on_cpu.MODEL: 2, on_cpu.PYTHON: 1})


def test_the_process_cpu_is_shared_out_as_the_samples_are():
    shares = on_cpu.ms_per_item(Counter({on_cpu.MODEL: 3, "kernel": 1}), cpu_seconds=2.0, items=100)
    assert shares[on_cpu.MODEL] == pytest.approx(15.0)
    assert shares["kernel"] == pytest.approx(5.0)
    assert sum(shares.values()) == pytest.approx(20.0)
    assert on_cpu.ms_per_item(Counter(), cpu_seconds=2.0, items=100) == {}
