"""The request bodies that carry images (handlers/tasks/image_text.py serves them).

    ""               {"inputs": [{"image": ...} | {"text": ...} | "text", ...]}, or an image as the body
    v1/embeddings    OpenAI's body with Infinity's `modality`: "image" (`input` holds images) or "text"
    zero-shot        {"image": ..., "candidate_labels": [...], "hypothesis_template": "This is a photo of {}."}
                     -> [{"score", "label"}] best first, as transformers' zero-shot-image-classification
    KServe v2        one BYTES input tensor named "image", its data the images
    v2/embed         Cohere's v2 embed with `images` or `texts`, embedding types float and base64

An image is a data URI or bare base64 text (or the whole body, with an image content type). Each
body's images are handed to `read_images`, the task's decoder, which refuses a bad one by name.
"""

import dataclasses
from typing import Any, Callable

from ts_compiled_handlers.protocols import Protocol, Request, RequestSpec, Served
from ts_compiled_handlers.protocols.cohere import INPUT_TYPES, CohereForm, embed_answer, truncation
from ts_compiled_handlers.protocols.kserve_v2 import KServeV2Protocol, V2Form, is_v2, parse
from ts_compiled_handlers.protocols.openai import (
    EMBEDDING_FIELDS,
    ENCODINGS,
    EmbeddingsForm,
    EmbeddingsProtocol,
    OpenAIProtocol,
)
from ts_compiled_handlers.request.answers import written
from ts_compiled_handlers.request.payload import RequestError, check_params, check_texts

MODALITIES = ("text", "image")
PIPELINE_TEMPLATE = "This is a photo of {}."  # transformers' zero-shot-image-classification default


@dataclasses.dataclass(frozen=True)
class ImageInputs:
    """A request's images: where each stands among its inputs, and their pixels, preprocessed."""

    positions: list[int]
    pixels: Any  # (images, 3, H, W): the processor's 8-bit pixels, not yet normalized (or float32 ones)
    tokens: int = 0  # what the vision tower reads of them: each image's patches and its class token


# (images, their fields' names for errors, their positions among the inputs) -> ImageInputs
ReadImages = Callable[[list, list[str], list[int]], ImageInputs]


def count_checked(items: list, spec: RequestSpec, field: str) -> list:
    if not items:
        raise RequestError(400, f"'{field}' is an empty list: send at least one input", field)
    if len(items) > spec.max_inputs:
        raise RequestError(413, f"'{field}' has {len(items)} items; at most {spec.max_inputs} per request", field)
    return items


class MixedInputsProtocol(Protocol):
    """This package's plain body with images among the inputs; answered as the plain protocol."""

    routes = ("",)
    takes_image_body = True

    def __init__(self, read_images: ReadImages):
        self.read_images = read_images

    def accepts(self, value: Any) -> bool:
        if isinstance(value, bytes):
            return True
        inputs = value.get("inputs") if isinstance(value, dict) else None
        items = inputs if isinstance(inputs, list) else [inputs]
        return any(isinstance(item, dict) and item.keys() & {"image", "text"} for item in items)  # not KServe v2's

    def read(self, value: Any, spec: RequestSpec) -> Request:
        if isinstance(value, bytes):
            return Request([], {}, self, is_list=False, images=self.read_images([value], ["body"], [0]))
        inputs = value["inputs"]
        items = count_checked(inputs if isinstance(inputs, list) else [inputs], spec, "inputs")
        texts, images, positions = [], [], []
        for position, item in enumerate(items):
            kind, content = _item(item, position)
            if kind == "image":
                images.append(content)
                positions.append(position)
            else:
                texts.append(content)
        if texts:
            check_texts(texts, spec.max_inputs)
        params = check_params({name: param for name, param in value.items() if name != "inputs"}, spec.params)
        fields = [f"inputs[{position}].image" for position in positions]
        decoded = self.read_images(images, fields, positions) if images else None
        return Request(texts, params, self, isinstance(inputs, list), images=decoded)

    def encode(self, request: Request, answers: list, served: Served, prompt_tokens: int = 0) -> Any:
        return written(answers if request.is_list else answers[0])


def _item(item: Any, position: int) -> tuple[str, Any]:
    if isinstance(item, str):
        return "text", item
    if isinstance(item, dict) and len(item) == 1 and ("text" in item or "image" in item):
        kind = next(iter(item))
        return kind, item[kind]
    raise RequestError(400, f"'inputs'[{position}] must be a string, {{'text': ...}} or {{'image': ...}}", "inputs")


class ImageEmbeddingsProtocol(EmbeddingsProtocol):
    """OpenAI's `v1/embeddings` with Infinity's `modality`: "image" reads `input` as images, "text"
    (the default) as the text body it is everywhere else."""

    def __init__(self, read_images: ReadImages):
        self.read_images = read_images

    def read(self, value: Any, spec: RequestSpec) -> Request:
        body = self.body_object(value, spec)
        modality = body.get("modality", "text")
        if modality not in MODALITIES:
            raise RequestError(400, f"'modality' must be one of: {', '.join(MODALITIES)}", "modality")
        body = {name: item for name, item in body.items() if name != "modality"}
        if modality == "text":
            return super().read(body, spec)
        encoding = body.get("encoding_format") or "float"
        if encoding not in ENCODINGS:
            raise RequestError(400, f"'encoding_format' must be one of {', '.join(ENCODINGS)}", "encoding_format")
        inputs = body.get("input")
        images = count_checked(inputs if isinstance(inputs, list) else [inputs], spec, "input")
        params = check_params({key: item for key, item in body.items() if key not in EMBEDDING_FIELDS}, spec.params)
        positions = list(range(len(images)))
        decoded = self.read_images(images, [f"input[{position}]" for position in positions], positions)
        return Request([], params, self, form=EmbeddingsForm(encoding), images=decoded)


MAX_TEMPLATE = 1000  # characters: each label's text repeats it (63 labels x a 6 MB template would not fit)


@dataclasses.dataclass(frozen=True)
class ZeroShotForm:
    labels: list[str]


class ZeroShotProtocol(Protocol):
    """An image scored against labels: each label put in the template, embedded with the image in
    one call, and scored as CLIP's pipeline scores (softmax over the labels of the model's logit
    scale times each cosine)."""

    routes = ("zero-shot",)
    texts_field = "candidate_labels"

    def __init__(self, read_images: ReadImages):
        self.read_images = read_images

    def read(self, value: Any, spec: RequestSpec) -> Request:
        if not isinstance(value, dict) or "image" not in value or "candidate_labels" not in value:
            raise RequestError(400, "the body must be a JSON object with 'image' and 'candidate_labels'", "image")
        unknown = set(value) - {"image", "candidate_labels", "hypothesis_template"}
        if unknown:
            raise RequestError(400, "unknown field; allowed: image, candidate_labels, hypothesis_template")
        labels = value["candidate_labels"]
        labels = check_texts(labels if isinstance(labels, list) else [labels], spec.max_inputs - 1, "candidate_labels")
        template = value.get("hypothesis_template", PIPELINE_TEMPLATE)
        if not isinstance(template, str) or template.count("{}") != 1 or len(template) > MAX_TEMPLATE:
            message = f"'hypothesis_template' must be text of at most {MAX_TEMPLATE} characters, with one '{{}}'"
            field = "hypothesis_template"
            raise RequestError(400, message + " where a label goes (the pipeline's format fills one)", field)
        texts = [template.replace("{}", label) for label in labels]
        images = self.read_images([value["image"]], ["image"], [0])
        return Request(texts, {}, self, form=ZeroShotForm(labels), images=images)

    def encode(self, request: Request, answers: list, served: Served, prompt_tokens: int = 0) -> Any:
        return written(answers)


class ImageKServeProtocol(KServeV2Protocol):
    """KServe v2 with images: one BYTES input tensor named `image`, each item an image's base64 (or
    data URI); answered as every v2 request, an `embedding` tensor."""

    def __init__(self, read_images: ReadImages):
        self.read_images = read_images

    def accepts(self, value: Any) -> bool:
        return is_v2(value) and value["inputs"][0].get("name") == "image"

    def read(self, value: Any, spec: RequestSpec) -> Request:
        images, params, request_id = parse(value, spec.params, spec.max_inputs)
        positions = list(range(len(images)))
        decoded = self.read_images(images, [f"inputs[0].data[{position}]" for position in positions], positions)
        return Request([], params, self, form=V2Form(request_id), images=decoded)


COHERE_FIELDS = {"texts", "images", "model", "input_type", "embedding_types", "truncate"}
COHERE_TYPES = ("float", "base64")  # float32 answers only: no int8 or binary ranges for images


class ImageCohereProtocol(Protocol):
    """Cohere's `v2/embed` on an image archive: `images` (data URIs) or `texts`, one of them;
    `embedding_types` float and base64; `input_type` any of Cohere's (CLIP has no prompts)."""

    routes = ("v2/embed",)
    texts_field = "texts"

    def __init__(self, read_images: ReadImages):
        self.read_images = read_images

    def read(self, value: Any, spec: RequestSpec) -> Request:
        body = {key: item for key, item in OpenAIProtocol.body_object(value, spec).items() if item is not None}
        unknown = sorted(set(body) - COHERE_FIELDS)
        if unknown:
            raise RequestError(400, f"'{unknown[0]}' is not served on an image model", unknown[0])
        if ("texts" in body) == ("images" in body):
            raise RequestError(400, "send 'texts' or 'images', one of them", "images")
        kinds = body.get("embedding_types", ["float"])
        if not isinstance(kinds, list) or not kinds or not all(kind in COHERE_TYPES for kind in kinds):
            raise RequestError(
                400, f"'embedding_types' must be a list of: {', '.join(COHERE_TYPES)}", "embedding_types"
            )
        input_type = body.get("input_type", "image")
        if not isinstance(input_type, str) or input_type not in (*INPUT_TYPES, "image"):
            raise RequestError(400, f"'input_type' must be one of: {', '.join((*INPUT_TYPES, 'image'))}", "input_type")
        params = check_params(truncation(body.get("truncate", "END")), spec.params)
        form = CohereForm(tuple(dict.fromkeys(kinds)))
        if "texts" in body:
            texts = body["texts"] if isinstance(body["texts"], list) else None
            if texts is None:
                raise RequestError(400, "'texts' must be a list of strings", "texts")
            return Request(check_texts(texts, spec.max_inputs, "texts"), params, self, form=form)
        images = count_checked(body["images"] if isinstance(body["images"], list) else [None], spec, "images")
        positions = list(range(len(images)))
        decoded = self.read_images(images, [f"images[{position}]" for position in positions], positions)
        return Request([], params, self, form=form, images=decoded)

    def encode(self, request: Request, answers: list, served: Served, prompt_tokens: int = 0) -> Any:
        vectors = [answer.embedding for answer in answers]
        images = 0 if request.images is None else len(request.images.positions)
        columns = dict.fromkeys(request.form.embedding_types, vectors)
        return embed_answer(request.texts, columns, {"input_tokens": prompt_tokens, "images": images})

    def error(self, error: RequestError) -> Any:
        return {"message": error.message}
