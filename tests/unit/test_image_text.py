"""CLIP archives (`image-text-embedding`): image and text vectors equal to transformers'
`get_image_features` / `get_text_features` with the model's own processor, both towers compiled
and warmed, nothing compiled after ready for any mix; hostile images refused by name, alone."""

import base64
import dataclasses
import io
import shutil

import numpy as np
import pytest
import torch
from fakes import answered, build_aot_package, ready_handler, status
from PIL import Image
from test_adapters import ask
from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

from ts_compiled_handlers.compiling.compiling import compiled_graph_count
from ts_compiled_handlers.scripts.build_mar import serving_files
from ts_compiled_handlers.scripts.task_inference import infer_task
from ts_compiled_handlers.startup import aot_start, warmup
from ts_compiled_handlers.tasks import image_text

GRID = {"seq_lens": [8, 64], "batch_sizes": [1, 4]}  # 64: the model's limit, as a template with labels reaches it
TEXTS = ["a cat sat on the mat", "hello world", "the red house by the blue river in berlin"]


def picture(seed: int, size=(40, 30), mode="RGB", image_format="PNG", **save) -> bytes:
    pixels = (np.random.default_rng(seed).random((size[1], size[0], 3)) * 255).astype(np.uint8)
    image = Image.fromarray(pixels, "RGB").convert(mode)
    out = io.BytesIO()
    image.save(out, image_format, **save)
    return out.getvalue()


def data_uri(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64," + base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def clip_dir(tiny_models):
    return tiny_models["image-text-embedding"]


@pytest.fixture(scope="module")
def reference(clip_dir):
    model = CLIPModel.from_pretrained(clip_dir).eval()
    processor, tokenizer = AutoImageProcessor.from_pretrained(clip_dir), AutoTokenizer.from_pretrained(clip_dir)

    def images(datas: list[bytes]) -> torch.Tensor:
        pixels = processor(images=[Image.open(io.BytesIO(d)).convert("RGB") for d in datas], return_tensors="pt")
        with torch.inference_mode():
            return model.get_image_features(**pixels).pooler_output

    def texts(strings: list[str]) -> torch.Tensor:
        with torch.inference_mode():
            return model.get_text_features(**tokenizer(strings, padding=True, return_tensors="pt")).pooler_output

    return images, texts


@pytest.fixture(scope="module")
def st_clip_dir(clip_dir, tmp_path_factory):
    """The tiny CLIP as sentence-transformers saves it: its image processor inside processor_config.json."""
    from sentence_transformers import SentenceTransformer

    folder = tmp_path_factory.mktemp("st-clip")
    SentenceTransformer(str(clip_dir), device="cpu").save(str(folder))
    return folder


@pytest.fixture(scope="module")
def handler(st_clip_dir):
    """Served from sentence-transformers' folder of the tiny CLIP: the same weights as `clip_dir`'s."""
    return ready_handler("image-text-embedding", st_clip_dir, buckets=GRID)


def cosines(got: list, want: torch.Tensor) -> list[float]:
    got = torch.tensor(np.array(got), dtype=torch.float32)
    return torch.nn.functional.cosine_similarity(got, want.float(), dim=-1).tolist()


def test_the_task_is_inferred_from_a_clip_folder_with_its_image_processor(clip_dir, st_clip_dir):
    assert infer_task(clip_dir) == "image-text-embedding"
    assert not (st_clip_dir / "preprocessor_config.json").exists()
    assert infer_task(st_clip_dir) == "image-text-embedding"
    assert st_clip_dir / "processor_config.json" in serving_files(st_clip_dir)  # the build packs it


def test_a_sentence_transformers_clip_answers_as_its_encode(st_clip_dir, handler):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(st_clip_dir), device="cpu")
    pictures = [picture(seed) for seed in (20, 21)]
    [answer] = answered(handler, [{"inputs": [*[{"image": data_uri(data)} for data in pictures], *TEXTS]}])
    vectors = [item["embedding"] for item in answer]
    images = model.encode([Image.open(io.BytesIO(data)).convert("RGB") for data in pictures], convert_to_tensor=True)
    assert min(cosines(vectors[:2], images)) >= 0.9999
    assert min(cosines(vectors[2:], model.encode(TEXTS, convert_to_tensor=True))) >= 0.9999


def test_images_and_texts_in_one_request_equal_transformers_in_their_order(handler, reference):
    images, texts = reference
    pictures = [picture(seed) for seed in range(3)]
    inputs = [{"image": data_uri(pictures[0])}, TEXTS[0], {"image": data_uri(pictures[1])}, {"text": TEXTS[1]}]
    inputs.append({"image": base64.b64encode(pictures[2]).decode()})  # bare base64 too
    [answer] = answered(handler, [{"inputs": inputs}])
    vectors = [item["embedding"] for item in answer]
    assert min(cosines([vectors[i] for i in (0, 2, 4)], images(pictures))) >= 0.9999
    assert min(cosines([vectors[i] for i in (1, 3)], texts(TEXTS[:2]))) >= 0.9999
    normalized = answered(handler, [{"inputs": [{"image": data_uri(pictures[0])}], "normalize": True}])
    assert np.linalg.norm(normalized[0][0]["embedding"]) == pytest.approx(1.0, abs=1e-5)


def test_text_only_and_a_binary_image_body_are_answered(handler, reference):
    images, texts = reference
    data = picture(7)
    answers = answered(handler, [{"inputs": TEXTS}, data], ["application/json", "image/png"])
    assert min(cosines([item["embedding"] for item in answers[0]], texts(TEXTS))) >= 0.9999
    assert min(cosines([answers[1]["embedding"]], images([data]))) >= 0.9999


def test_no_mix_of_image_counts_and_text_lengths_compiles_after_ready(handler):
    graphs = compiled_graph_count()
    for count in (1, 3, 4, 5, 9):  # 5 and 9: more than the largest batch, run in calls of it
        inputs = [{"image": data_uri(picture(seed))} for seed in range(count)] + TEXTS[: count % 3 + 1]
        [answer] = answered(handler, [{"inputs": inputs}])
        assert len(answer) == len(inputs)
    assert compiled_graph_count() == graphs
    assert handler.engine.model.recompiles_after_ready == 0
    assert handler.worker.task.vision.source == "compiled"


def animated_gif() -> bytes:
    frames = [Image.fromarray(np.full((16, 16, 3), shade, np.uint8), "RGB") for shade in (0, 120, 250)]
    out = io.BytesIO()
    frames[0].save(out, "GIF", save_all=True, append_images=frames[1:], duration=50)
    return out.getvalue()


def huge_png() -> bytes:
    """20,000 x 20,000 black pixels in a few KB (zlib compresses zeros ~1000:1)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 20000, 20000, 1, 0, 0, 0, 0)  # 1-bit grey
    rows = zlib.compress(b"\0" * (1 + 20000 // 8) * 20000, 9)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")


HOSTILE = {
    "truncated": (data_uri(picture(1)[:200]), 400, "truncated or corrupt PNG"),
    "bomb": (data_uri(huge_png()), 413, "has more pixels than 40000000"),
    "strip": (data_uri(picture(1, size=(20000, 1))), 413, "20000 x 1 pixels; one side may be at most 100 times"),
    "animated": (data_uri(animated_gif(), "gif"), 400, "is an animated GIF; send one frame"),
    "cmyk": (data_uri(picture(2, mode="CMYK", image_format="JPEG"), "jpeg"), 415, "colour mode CMYK"),
    "not an image": (data_uri(b"%PDF-1.4 not a picture at all"), 415, "not an image in a format served here"),
    "url": ("https://example.com/cat.png", 400, "images are not fetched"),
    "not base64": ("data:image/png;base64,@@@", 400, "neither a data URI nor base64"),
}


def test_hostile_images_are_refused_by_name_and_their_batch_mates_answered(handler, reference):
    images, _ = reference
    good = picture(3)
    bodies = [{"inputs": [{"image": value}, "a cat"]} for value, _, _ in HOSTILE.values()]
    bodies.append({"inputs": [{"image": data_uri(good)}]})
    answers = answered(handler, bodies)
    for position, (name, (_, code, reason)) in enumerate(HOSTILE.items()):
        assert status(handler.context, position) == code, name
        assert reason in answers[position]["error"], (name, answers[position])
    assert status(handler.context, len(HOSTILE)) == 200
    assert min(cosines([answers[-1][0]["embedding"]], images([good]))) >= 0.9999


def test_an_image_url_is_fetched_from_an_allowed_origin_only(handler, reference, monkeypatch):
    """`images.fetch_from` names the origin (the task reads it from the archive's config; here set
    on the running task): its URL is answered as the image sent would be, another host's refused."""
    from image_server import png, serving_pictures

    images, _ = reference
    task = handler.worker.task
    with serving_pictures() as origin:
        monkeypatch.setattr(task, "limits", dataclasses.replace(task.limits, fetch_from=(origin,)))
        bodies = [{"inputs": [{"image": f"{origin}/cat.png"}]}, {"inputs": [{"image": "http://127.0.0.2/cat.png"}]}]
        answers = answered(handler, bodies)
    assert min(cosines([answers[0][0]["embedding"]], images([png()]))) >= 0.9999
    assert status(handler.context, 1) == 400 and "its host is not one" in answers[1]["error"]


def test_a_phone_photo_stored_sideways_embeds_as_transformers_load_image_turns_it(handler, clip_dir):
    """EXIF orientation 6 (rotated 90 degrees): the pipeline's `load_image` turns the photo upright
    before its processor, and so does the worker."""
    from transformers.image_utils import load_image

    image = Image.open(io.BytesIO(picture(4, size=(64, 48), image_format="JPEG", quality=95)))
    exif = image.getexif()
    exif[0x0112] = 6
    out = io.BytesIO()
    image.save(out, "JPEG", exif=exif.tobytes(), quality=95)
    sideways = data_uri(out.getvalue(), "jpeg")
    model = CLIPModel.from_pretrained(clip_dir).eval()
    pixels = AutoImageProcessor.from_pretrained(clip_dir)(images=[load_image(sideways)], return_tensors="pt")
    with torch.inference_mode():
        wanted = model.get_image_features(**pixels).pooler_output
    upright = answered(handler, [{"inputs": [{"image": sideways}]}])[0][0]["embedding"]
    assert min(cosines([upright], wanted)) >= 0.9999
    stored = answered(handler, [{"inputs": [{"image": data_uri(picture(4, size=(64, 48), image_format="JPEG"))}]}])
    assert min(cosines([stored[0][0]["embedding"]], wanted)) < 0.99  # as stored, it is another picture


def test_images_are_held_as_the_processors_8_bit_pixels_until_the_model_call(handler, reference):
    from ts_compiled_handlers.worker.messages import Incoming

    images, _ = reference
    pictures = [picture(seed, size=(90, 70)) for seed in (5, 6)]
    body = {"inputs": [{"image": data_uri(data)} for data in pictures]}
    held = handler.worker.reader.accept(Incoming(body, "application/json")).request.images.pixels
    assert held.dtype == torch.uint8 and tuple(held.shape) == (2, 3, 32, 32)  # 3 KB each, 12 KB as float32
    assert min(cosines([row["embedding"] for row in answered(handler, [body])[0]], images(pictures))) >= 0.9999


def test_a_batch_past_its_image_budget_refuses_the_request_that_passes_it_alone(handler, reference, monkeypatch):
    """`images.batch_images: 3`: of requests with 2, 2 and 1 images in one batch, the second is a 503
    naming the limit (it would fit alone), the others are answered."""
    images, _ = reference
    task = handler.worker.task
    config = dataclasses.replace(task.config, images=dataclasses.replace(task.config.images, batch_images=3))
    monkeypatch.setattr(task, "config", config)
    pictures = [picture(seed) for seed in range(7, 12)]
    bodies = [{"inputs": [{"image": data_uri(data)} for data in chunk]} for chunk in (pictures[:2], pictures[2:4])]
    bodies.append({"inputs": [{"image": data_uri(pictures[4])}]})
    answers = answered(handler, bodies)
    assert [status(handler.context, index) for index in range(3)] == [200, 503, 200]
    assert "images.batch_images (3)" in answers[1]["error"]
    got = [row["embedding"] for row in answers[0]] + [answers[2][0]["embedding"]]
    assert min(cosines(got, images([*pictures[:2], pictures[4]]))) >= 0.9999


def test_malformed_inputs_are_refused(handler):
    bodies = [
        {"inputs": [{"image": "x", "text": "y"}]},
        {"inputs": [{"video": "x"}]},
        {"inputs": [{"image": data_uri(picture(1))}], "unknown": 1},
        {"inputs": [{"text": ""}]},
    ]
    answered(handler, bodies)
    assert [status(handler.context, index) for index in range(len(bodies))] == [400] * len(bodies)


def mangled(rng, data: bytes) -> bytes:
    """A real image cut short, with bytes flipped, or bytes of noise."""
    kind = rng.randrange(3)
    if kind == 0:
        return data[: rng.randrange(len(data))]
    if kind == 1:
        flipped = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            flipped[rng.randrange(len(flipped))] = rng.randrange(256)
        return bytes(flipped)
    return rng.randbytes(rng.randint(1, 300))


def test_mangled_images_never_fail_the_worker_or_their_batch_mates(handler):
    """Seeded: whatever the bytes, a 200 or a 4xx naming the image, never a 500; the ordinary
    request beside them is answered."""
    import random

    rng = random.Random(59)
    sources = [picture(seed, image_format=kind) for seed, kind in enumerate(("PNG", "JPEG", "GIF", "WEBP", "BMP"))]
    for _ in range(4):
        cases = [mangled(rng, rng.choice(sources)) for _ in range(8)]
        bodies = [{"inputs": [{"image": data_uri(case)}]} if i % 2 else case for i, case in enumerate(cases)]
        kinds = ["application/json" if i % 2 else "image/png" for i in range(len(cases))]
        answers = answered(handler, [*bodies, {"inputs": ["a cat"]}], [*kinds, "application/json"])
        codes = [status(handler.context, index) for index in range(len(bodies))]
        assert all(code == 200 or 400 <= code < 500 for code in codes), codes
        assert status(handler.context, len(bodies)) == 200 and len(answers[-1]) == 1


def test_openai_embeddings_take_images_with_infinitys_modality(handler, reference):
    images, texts = reference
    pictures = [picture(seed) for seed in (4, 5)]
    bodies = [
        {"input": [data_uri(data) for data in pictures], "modality": "image"},
        {"input": TEXTS[:2]},  # text, the default modality
        {"input": [data_uri(pictures[0])], "modality": "audio"},
        {"input": ["https://example.com/cat.png"], "modality": "image"},
    ]
    answers = ask(handler, bodies, ["v1/embeddings"] * len(bodies))
    assert min(cosines([item["embedding"] for item in answers[0]["data"]], images(pictures))) >= 0.9999
    assert min(cosines([item["embedding"] for item in answers[1]["data"]], texts(TEXTS[:2]))) >= 0.9999
    assert answers[2]["error"]["param"] == "modality" and status(handler.context, 2) == 400
    assert "images are not fetched" in answers[3]["error"]["message"] and answers[3]["error"]["param"] == "input[0]"


def test_zero_shot_scores_equal_transformers_pipeline_in_the_same_order(handler, clip_dir):
    from transformers import pipeline

    classify = pipeline("zero-shot-image-classification", model=str(clip_dir))
    labels = ["cat", "dog", "red house", "blue river"]
    for seed in (11, 12):
        data = picture(seed)
        expected = classify(Image.open(io.BytesIO(data)).convert("RGB"), candidate_labels=labels)
        [answer] = ask(handler, [{"image": data_uri(data), "candidate_labels": labels}], ["zero-shot"])
        assert [item["label"] for item in answer] == [item["label"] for item in expected]
        assert max(abs(got["score"] - want["score"]) for got, want in zip(answer, expected, strict=True)) <= 1e-4
    bodies = [
        {"image": data_uri(picture(1)), "candidate_labels": ["cat"], "hypothesis_template": template}
        for template in ("{0} {x}", "{}" * 4000, "a photo of {}." + "x" * 1000)  # a label per '{}' grew quadratically
    ]
    ask(handler, [*bodies, {"image": data_uri(picture(1))}], ["zero-shot"] * 4)
    assert [status(handler.context, index) for index in range(4)] == [400] * 4


def test_kserve_v2_takes_images_as_a_bytes_tensor_named_image(handler, reference):
    images, texts = reference
    pictures = [picture(seed) for seed in (6, 8)]
    tensor = {"name": "image", "shape": [2], "datatype": "BYTES", "data": [data_uri(data) for data in pictures]}
    text = {"name": "text", "shape": [1], "datatype": "BYTES", "data": [TEXTS[0]]}
    answers = answered(handler, [{"id": "7", "inputs": [tensor]}, {"inputs": [text]}])
    [output] = answers[0]["outputs"]
    assert answers[0]["id"] == "7" and output["name"] == "embedding" and output["shape"] == [2, 16]
    assert min(cosines(np.array(output["data"]).reshape(2, 16), images(pictures))) >= 0.9999
    assert min(cosines(np.array(answers[1]["outputs"][0]["data"]).reshape(1, 16), texts(TEXTS[:1]))) >= 0.9999


def test_an_image_weighs_its_patches_in_the_call_budget(handler):
    """The token scheduler takes `work`: the tiny model reads 32 x 32 pixels in 8-pixel patches."""
    from ts_compiled_handlers.worker.messages import Incoming

    body = {"inputs": [{"image": data_uri(picture(1))}, "a cat", {"image": data_uri(picture(2))}]}
    accepted = handler.worker.reader.accept(Incoming(body, "application/json"))
    assert accepted.tokens == len(accepted.token_ids[0]) and accepted.work == accepted.tokens + 2 * (16 + 1)


def test_cohere_v2_embed_takes_images_or_texts(handler, reference):
    images, texts = reference
    pictures = [picture(seed) for seed in (9, 10)]
    bodies = [
        {
            "images": [data_uri(data) for data in pictures],
            "input_type": "image",
            "embedding_types": ["float", "base64"],
        },
        {"texts": TEXTS[:2], "input_type": "search_query"},
        {"texts": TEXTS[:1], "images": [data_uri(pictures[0])]},
        {"images": [data_uri(pictures[0])], "embedding_types": ["int8"]},
        {"images": ["https://example.com/cat.png"]},
        {"images": [data_uri(pictures[0])], "embedding_types": [["float"]]},  # unhashable: a 500 once
        {"texts": TEXTS[:1], "truncate": {}},
        {"texts": TEXTS[:1], "input_type": []},
    ]
    answers = ask(handler, bodies, ["v2/embed"] * len(bodies))
    floats = answers[0]["embeddings"]["float"]
    assert min(cosines(floats, images(pictures))) >= 0.9999
    packed = [np.frombuffer(base64.b64decode(text), "<f4") for text in answers[0]["embeddings"]["base64"]]
    np.testing.assert_array_equal(np.array(packed), np.array(floats, dtype=np.float32))
    assert answers[0]["meta"]["billed_units"]["images"] == 2 and answers[0]["texts"] == []
    assert min(cosines(answers[1]["embeddings"]["float"], texts(TEXTS[:2]))) >= 0.9999
    assert [status(handler.context, index) for index in range(2, 8)] == [400] * 6
    for index, field in ((5, "embedding_types"), (6, "truncate"), (7, "input_type")):
        assert f"'{field}'" in answers[index]["message"]
    assert "one of them" in answers[2]["message"] and "images are not fetched" in answers[4]["message"]


@pytest.mark.parametrize("policy", ["eager", "fail"])
def test_a_vision_check_that_fails_follows_on_failure(clip_dir, monkeypatch, caplog, policy):
    from ts_compiled_handlers.startup import warmup

    check = warmup.check_drift

    def drifting(name, outputs, reference, tolerance):
        if name.startswith("images, served"):
            raise warmup.WarmupError(f"{name}: outputs drift 1.0e+00 from the reference")
        return check(name, outputs, reference, tolerance)

    monkeypatch.setattr(warmup, "check_drift", drifting)
    config = {"buckets": {"seq_lens": [64], "batch_sizes": [1]}, "compile": {"on_failure": policy}}  # one graph each
    if policy == "fail":
        with pytest.raises(warmup.WarmupError):
            ready_handler("image-text-embedding", clip_dir, **config)
        return
    handler = ready_handler("image-text-embedding", clip_dir, **config)
    assert "Images served EAGERLY" in caplog.text and handler.worker.task.vision.source == "eager"
    [answer] = answered(handler, [{"inputs": [{"image": data_uri(picture(1))}]}])
    assert len(answer) == 1 and status(handler.context, 0) == 200


@pytest.fixture(scope="module")
def aot_clip_dir(st_clip_dir, tmp_path_factory):
    """The sentence-transformers CLIP with both towers' AOT packages (`hfserve build --precompile aot`'s)."""
    model = tmp_path_factory.mktemp("aot-clip") / "model"
    shutil.copytree(st_clip_dir, model)
    built = build_aot_package("image-text-embedding", model, {"handler": {"dtype": "float32", "buckets": GRID}})
    assert set(built["side_packages"]) == {"vision"}
    return model


def test_both_towers_serve_from_their_aot_packages_as_transformers_and_trace_nothing(
    aot_clip_dir, clip_dir, reference, caplog
):
    from transformers import pipeline

    images, texts = reference
    packaged = ready_handler("image-text-embedding", aot_clip_dir, buckets=GRID)  # counts graphs from here
    assert packaged.model_source == "aot package" and packaged.worker.task.side_sources() == {"vision": "aot package"}
    pictures = [picture(seed) for seed in range(5)]  # 5: more than the largest batch
    inputs = [{"image": data_uri(data)} for data in pictures] + TEXTS
    [answer] = answered(packaged, [{"inputs": inputs}])
    vectors = [row["embedding"] for row in answer]
    assert min(cosines(vectors[:5], images(pictures))) >= 0.9999
    assert min(cosines(vectors[5:], texts(TEXTS))) >= 0.9999
    labels = ["cat", "dog", "red house"]
    expected = pipeline("zero-shot-image-classification", model=str(clip_dir))(
        Image.open(io.BytesIO(pictures[0])).convert("RGB"), candidate_labels=labels
    )
    [scores] = ask(packaged, [{"image": data_uri(pictures[0]), "candidate_labels": labels}], ["zero-shot"])
    assert [item["label"] for item in scores] == [item["label"] for item in expected]
    assert max(abs(got["score"] - want["score"]) for got, want in zip(scores, expected, strict=True)) <= 1e-4
    assert compiled_graph_count() == 0 and packaged.engine.model.recompiles_after_ready == 0
    # a vision package whose answers drift from the build's float32 ones is refused (then compiled:
    # the damaged package's test below follows that path)
    dtype = packaged.engine.dtype
    package = aot_start.side_packages(packaged.serving, dtype).load("vision")
    package.reference = {**package.reference, "rows": -package.reference["rows"]}
    assert image_text.packaged_vision(package, packaged.serving, dtype, warmup.check_drift) is None
    assert "AOT package aot_package/vision/ IGNORED" in caplog.text and "vs the build's float32 eager" in caplog.text


def test_a_damaged_vision_package_is_ignored_and_the_tower_compiled(aot_clip_dir, reference, tmp_path, caplog):
    model = tmp_path / "model"
    shutil.copytree(aot_clip_dir, model)
    package = model / "aot_package" / "vision" / "model.pt2"
    package.write_bytes(package.read_bytes()[:1000])
    packaged = ready_handler("image-text-embedding", model, buckets=GRID)
    assert "AOT package aot_package/vision/ IGNORED" in caplog.text and "sha256 mismatch" in caplog.text
    assert packaged.model_source == "aot package" and packaged.worker.task.side_sources() == {"vision": "compiled"}
    [answer] = answered(packaged, [{"inputs": [{"image": data_uri(picture(3))}]}])
    assert min(cosines([answer[0]["embedding"]], reference[0]([picture(3)]))) >= 0.9999


# SigLIP: texts padded to 64 and read without a mask, the last token pooled; images with no class
# token; zero-shot a sigmoid per label. One batch size: one graph per tower.
SIGLIP_GRID = {"batch_sizes": [4]}


@pytest.fixture(scope="module")
def siglip_dir(tiny_models):
    return tiny_models["image-text-embedding-siglip"]


@pytest.fixture(scope="module")
def siglip_handler(siglip_dir):
    return ready_handler("image-text-embedding", siglip_dir, buckets=SIGLIP_GRID)


def test_siglip_vectors_equal_transformers_with_max_length_padding(siglip_dir, siglip_handler):
    assert infer_task(siglip_dir) == "image-text-embedding"
    assert siglip_handler.engine.plan.seq_lens == (64,)
    graphs = compiled_graph_count()
    assert_siglip_vectors(siglip_dir, siglip_handler)
    assert compiled_graph_count() == graphs


def assert_siglip_vectors(siglip_dir, handler) -> None:
    """Two images and three texts in one request, against transformers' SigLIP with its processor."""
    from transformers import SiglipModel

    model = SiglipModel.from_pretrained(siglip_dir).eval()
    processor, tokenizer = AutoImageProcessor.from_pretrained(siglip_dir), AutoTokenizer.from_pretrained(siglip_dir)
    pictures = [picture(seed) for seed in (1, 2)]
    [answer] = answered(
        handler, [{"inputs": [{"image": data_uri(pictures[0])}, *TEXTS, {"image": data_uri(pictures[1])}]}]
    )
    tokens = tokenizer(TEXTS, padding="max_length", max_length=64, truncation=True, return_tensors="pt")
    assert list(tokens) == ["input_ids"]  # as SigLIP's own tokenizer: no mask, the padding is read
    with torch.inference_mode():
        texts = model.get_text_features(**tokens).pooler_output
        images = model.get_image_features(
            **processor(images=[Image.open(io.BytesIO(d)) for d in pictures], return_tensors="pt")
        ).pooler_output
    vectors = [item["embedding"] for item in answer]
    assert min(cosines(vectors[1:4], texts)) >= 0.9999
    assert min(cosines([vectors[0], vectors[4]], images)) >= 0.9999


def test_siglip_zero_shot_scores_each_label_alone_as_transformers_pipeline(siglip_dir, siglip_handler):
    from transformers import pipeline

    classify = pipeline("zero-shot-image-classification", model=str(siglip_dir))
    labels = ["cat", "dog", "red house", "blue river", "berlin"]
    data = picture(13)
    expected = classify(Image.open(io.BytesIO(data)).convert("RGB"), candidate_labels=labels)
    [answer] = ask(siglip_handler, [{"image": data_uri(data), "candidate_labels": labels}], ["zero-shot"])
    assert [item["label"] for item in answer] == [item["label"] for item in expected]
    assert max(abs(got["score"] - want["score"]) for got, want in zip(answer, expected, strict=True)) <= 1e-4
    assert sum(item["score"] for item in answer) != pytest.approx(1.0, abs=1e-3)  # sigmoids, not a softmax


def test_siglip_serves_from_its_aot_packages_as_transformers(siglip_dir, tmp_path):
    """Last: its handler's start resets dynamo under the compiled SigLIP handler of the tests above."""
    model = tmp_path / "model"
    shutil.copytree(siglip_dir, model)
    build_aot_package("image-text-embedding", model, {"handler": {"dtype": "float32", "buckets": SIGLIP_GRID}})
    packaged = ready_handler("image-text-embedding", model, buckets=SIGLIP_GRID)
    assert packaged.model_source == "aot package" and packaged.worker.task.side_sources() == {"vision": "aot package"}
    assert_siglip_vectors(siglip_dir, packaged)
    assert compiled_graph_count() == 0
