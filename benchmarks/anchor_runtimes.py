"""The runtimes benchmark_small_shapes holds ours against, each on the model's own HF graph (the
encoder with sentence-transformers' mean pooling and normalization, exported to ONNX once):

- `onnxruntime`: ONNX Runtime, every graph optimization on;
- `onnxruntime-int8`: the same graph after ONNX Runtime's `quantize_dynamic` (int8 weights,
  activations quantized per call), the route its docs give for transformers on the CPU;
- `openvino`: OpenVINO's CPU plugin (float32 where ours is float32, else its own default, which is
  bfloat16 on a CPU that has it);
- `openvino-int8`: the graph after NNCF's post-training quantization with the transformer preset,
  calibrated on the calibration texts ours is gated on; the ops left in floating point run at
  OpenVINO's default precision (bfloat16 where the CPU has it), its best configuration.

Each anchor is a callable on a batch of token id rows, as a server calls it: the rows padded into
numpy arrays, one synchronous request. Needs `pip install ts-compiled-handlers[anchors]`.
"""

from pathlib import Path

import torch

ANCHORS = ("onnxruntime", "onnxruntime-int8", "openvino", "openvino-int8")
NEEDS = {  # anchor: the modules it imports
    "onnxruntime": ("onnxruntime", "onnx", "onnxscript"),
    "onnxruntime-int8": ("onnxruntime", "onnx", "onnxscript"),
    "openvino": ("openvino", "onnx", "onnxscript"),
    "openvino-int8": ("openvino", "nncf", "onnx", "onnxscript"),
}


class MeanPooled(torch.nn.Module):
    """The HF encoder with sentence-transformers' mean pooling and normalization: MiniLM's embedding."""

    def __init__(self, encoder: torch.nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids, attention_mask):
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, dim=-1)


def padded(ids: list[list[int]]) -> dict:
    """Token id rows as an ONNX server feeds them: int64 arrays padded to the longest row."""
    import numpy as np

    length = max(len(row) for row in ids)
    input_ids = np.zeros((len(ids), length), dtype=np.int64)
    mask = np.zeros((len(ids), length), dtype=np.int64)
    for index, row in enumerate(ids):
        input_ids[index, : len(row)] = row
        mask[index, : len(row)] = 1
    return {"input_ids": input_ids, "attention_mask": mask}


def export_onnx(folder: Path, scratch: Path) -> Path:
    """The model's HF graph with its pooling as one ONNX file, batch and length dynamic."""
    from transformers import AutoModel

    model = MeanPooled(AutoModel.from_pretrained(folder).eval())
    example = {"input_ids": torch.ones(2, 16, dtype=torch.long), "attention_mask": torch.ones(2, 16, dtype=torch.long)}
    batch, length = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("length", min=2, max=512)
    shapes = {"input_ids": {0: batch, 1: length}, "attention_mask": {0: batch, 1: length}}
    path = scratch / "model.onnx"
    torch.onnx.export(model, (), str(path), kwargs=example, dynamic_shapes=shapes, dynamo=True, external_data=False)
    return path


def onnxruntime_call(path: Path, int8: bool):
    import onnxruntime
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    if int8:
        prepared, quantized = path.with_suffix(".pre.onnx"), path.with_suffix(".int8.onnx")
        # shapes inferred, the graph cleaned, as quantization expects (the dynamo export's symbolic
        # shapes defeat its symbolic pass, so that one is skipped)
        quant_pre_process(str(path), str(prepared), skip_symbolic_shape=True)
        quantize_dynamic(str(prepared), str(quantized), weight_type=QuantType.QInt8)
        path = quantized
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = torch.get_num_threads()
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return lambda ids: torch.from_numpy(session.run(None, padded(ids))[0])


def openvino_call(path: Path, int8: bool, float32: bool, calibration: list[list[int]], profiling: bool = False):
    import openvino

    model = openvino.convert_model(str(path))
    if int8:
        import nncf

        batches = [padded(calibration[start : start + 8]) for start in range(0, len(calibration), 8)]
        model = nncf.quantize(
            model, nncf.Dataset(batches), model_type=nncf.ModelType.TRANSFORMER, subset_size=len(batches)
        )
    # PERF_COUNT: the plugin times each node of every inference (ms_by_node_type reads the last one's)
    config = {"INFERENCE_NUM_THREADS": torch.get_num_threads(), "PERFORMANCE_HINT": "LATENCY", "PERF_COUNT": profiling}
    if float32 and not int8:
        config["INFERENCE_PRECISION_HINT"] = "f32"
    compiled = openvino.Core().compile_model(model, "CPU", config)
    request = compiled.create_infer_request()

    def call(ids):
        return torch.from_numpy(request.infer(padded(ids))[compiled.output(0)].copy())

    call.ms_by_node_type = lambda: ms_by_node_type(request.profiling_info)
    return call


def ms_by_node_type(nodes) -> dict[str, float]:
    """OpenVINO's per-node timing of one inference, summed by node type and the kernel that ran it."""
    found: dict[str, float] = {}
    for node in nodes:
        if node.status == node.Status.EXECUTED:
            key = f"{node.node_type} ({node.exec_type})"
            found[key] = found.get(key, 0.0) + node.real_time.total_seconds() * 1000
    return found


def anchor_call(
    name: str, folder: Path, scratch: Path, float32: bool, calibration: list[list[int]], profiling: bool = False
):
    """The anchor `name` over the model in `folder`: a callable from token id rows to vectors
    (`profiling`: OpenVINO times each node, at some cost to every call, and the callable's
    `ms_by_node_type` reads the last call's times)."""
    path = export_onnx(folder, scratch)
    if name.startswith("onnxruntime"):
        return onnxruntime_call(path, int8=name.endswith("-int8"))
    return openvino_call(path, name.endswith("-int8"), float32, calibration, profiling)
