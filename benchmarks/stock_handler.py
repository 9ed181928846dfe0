"""TorchServe's stock transformers handler, re-implemented faithfully for the load test's baseline.

Kept from TorchServe's generalized HF handler (examples/Huggingface_Transformers/
Transformer_handler_generalized.py) and `BaseHandler` (0.12): settings from model-config.yaml's
`handler:` section (`max_length`, `do_lower_case`), the model loaded with `from_pretrained`, each
request's raw body tokenized on its own and padded to `max_length`, the requests concatenated into
one batch, TorchServe's `pt2: compile:` options passed to `torch.compile` as `BaseHandler` does, and
no warm-up: each new shape compiles while requests wait.
Added: an embedding mode (mean pooling and L2 normalization, as sentence-transformers does), which
the stock handler lacks, so its answers can be checked against ours. Left out: logging request text.
"""

import logging
import os

import torch
from transformers import AutoModel, AutoTokenizer
from ts.torch_handler.base_handler import BaseHandler

logger = logging.getLogger(__name__)


class StockTransformersHandler(BaseHandler):
    def initialize(self, context):
        self.context = context
        self.model_yaml_config = context.model_yaml_config
        settings = self.model_yaml_config.get("handler", {})
        self.max_length = int(settings.get("max_length", 128))
        model_dir = context.system_properties["model_dir"]
        gpu = context.system_properties.get("gpu_id")
        self.device = torch.device(f"cuda:{gpu}" if torch.cuda.is_available() and gpu is not None else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, do_lower_case=settings.get("do_lower_case", True))
        self.model = AutoModel.from_pretrained(model_dir, use_safetensors=True).to(self.device).eval()
        options = dict(self.model_yaml_config.get("pt2", {}).get("compile", {}))
        if options.pop("enable", False):
            self.model = torch.compile(self.model, **options)
            logger.info("Compiled model with %s", options)
        logger.info("Stock handler ready in process %d, max_length %d", os.getpid(), self.max_length)
        self.initialized = True

    def preprocess(self, requests):
        input_ids, attention_mask = [], []
        for request in requests:
            text = request.get("data") or request.get("body")
            if isinstance(text, (bytes, bytearray)):
                text = text.decode("utf-8")
            inputs = self.tokenizer(
                text, max_length=self.max_length, padding="max_length", truncation=True, return_tensors="pt"
            )
            input_ids.append(inputs["input_ids"])
            attention_mask.append(inputs["attention_mask"])
        return torch.cat(input_ids).to(self.device), torch.cat(attention_mask).to(self.device)

    def inference(self, data, *args, **kwargs):
        input_ids, attention_mask = data
        with torch.inference_mode():
            hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, dim=-1)

    def postprocess(self, data):
        return [{"embedding": row} for row in data.float().cpu().tolist()]
