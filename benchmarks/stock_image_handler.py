"""TorchServe's stock way of serving CLIP, the load test's baseline for its image mix.

Written as TorchServe's docs teach a custom handler (`BaseHandler`: initialize, preprocess,
inference, postprocess) and as its vision handler reads an image (`ts.torch_handler.vision_handler`:
the request's raw bytes opened with PIL): the model, its image processor and its tokenizer loaded
with `from_pretrained`; each request an image (a binary body) or a text, texts padded to
`max_length`; TorchServe's `pt2: compile:` options passed to `torch.compile` as `BaseHandler`
does (here on the two feature functions, the model's `forward` needing both inputs); no warm-up:
each new batch shape compiles while requests wait. Answers as ours: `{"embedding": [...]}`, the
model's `get_image_features` / `get_text_features`. Left out: logging request content.
"""

import io
import logging

import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoModel, AutoTokenizer
from ts.torch_handler.base_handler import BaseHandler

logger = logging.getLogger(__name__)


class StockClipHandler(BaseHandler):
    def initialize(self, context):
        self.context = context
        self.model_yaml_config = context.model_yaml_config
        self.max_length = int(self.model_yaml_config.get("handler", {}).get("max_length", 64))
        model_dir = context.system_properties["model_dir"]
        gpu = context.system_properties.get("gpu_id")
        self.device = torch.device(f"cuda:{gpu}" if torch.cuda.is_available() and gpu is not None else "cpu")
        self.processor = AutoImageProcessor.from_pretrained(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModel.from_pretrained(model_dir, use_safetensors=True).to(self.device).eval()
        self.image_features, self.text_features = self.model.get_image_features, self.model.get_text_features
        options = dict(self.model_yaml_config.get("pt2", {}).get("compile", {}))
        if options.pop("enable", False):
            self.image_features = torch.compile(self.image_features, **options)
            self.text_features = torch.compile(self.text_features, **options)
            logger.info("Compiled the feature functions with %s", options)
        self.initialized = True

    def preprocess(self, requests):
        """Each request's image (bytes) or text (str, as TorchServe decodes a text body)."""
        return [request.get("data") or request.get("body") for request in requests]

    def inference(self, data, *args, **kwargs):
        images = [Image.open(io.BytesIO(item)).convert("RGB") for item in data if not isinstance(item, str)]
        texts = [item for item in data if isinstance(item, str)]
        with torch.inference_mode():
            image_rows = iter([])
            if images:
                pixels = self.processor(images=images, return_tensors="pt")["pixel_values"].to(self.device)
                image_rows = iter(self.image_features(pixel_values=pixels).pooler_output)
            text_rows = iter([])
            if texts:
                tokens = self.tokenizer(
                    texts, max_length=self.max_length, padding="max_length", truncation=True, return_tensors="pt"
                ).to(self.device)
                text_rows = iter(self.text_features(**tokens).pooler_output)
            return [next(text_rows if isinstance(item, str) else image_rows) for item in data]

    def postprocess(self, data):
        return [{"embedding": row.float().cpu().tolist()} for row in data]
