"""The texts a quantized model is held against float32 on (`handler.calibration`).

`default` is the varied set below, shipped in the package: queries and questions, passages of a
few sentences up to a few hundred tokens, numbers and dates, code, product listings, markup, other
languages and scripts, shouting and emoji, so that a model's outliers (long texts, rare tokens)
are met before traffic meets them. A file of the archive (`hfserve build --calibration FILE`: one
text per line) replaces it with the texts a deployment expects.

A reranker reads (query, document) pairs, never a text alone, so it is calibrated and gated on
pairs: each text beside the one half the set further on (every text once first, once second), or,
where every line of the file holds a tab, the pairs the file gives (query, tab, document). A pair
that a chat template renders into one text (an LLM reranker) is never cut, since its score is read
at its end: the rendered pairs longer than the largest bucket are left out, as a server refuses them.
"""

import re
from pathlib import Path


class CalibrationError(ValueError):
    """The archive's calibration file cannot be used (missing, unreadable, too few texts)."""


MIN_TEXTS = 8  # fewer would make the gate's figures luck
MAX_TEXTS = 256  # the gate runs them eagerly twice at start: bounded

_PASSAGE = (
    "The river rises in the hills north of the town and runs for about forty kilometres before it "
    "reaches the sea. In spring the snowmelt swells it, and the lower fields flood for a week or two; "
    "farmers there plant late, after the water has gone, and the silt it leaves makes the soil rich. "
    "A stone bridge built in 1742 still carries the main road across it, though lorries now take the "
    "bypass, and a footpath follows the east bank from the mill to the estuary."
)
_REPORT = (
    "Quarterly results: revenue rose 12.4% year on year to $3.81 billion, driven by cloud services "
    "(+27%) while hardware sales fell 6%. Operating margin narrowed to 18.2% from 19.5% as the "
    "company hired 1,400 engineers. Guidance for Q3: revenue between $3.9 and $4.05 billion. The "
    "board approved a dividend of $0.24 per share, payable on 15 August 2025 to holders of record "
    "on 1 August. Net cash stood at $2.2 billion after the $600 million acquisition of a payments start-up."
)
_MANUAL = (
    "To replace the filter, switch the unit off at the wall and wait five minutes for the fan to stop. "
    "Open the front panel by pressing both side clips at once, slide the old filter out, and check "
    "the arrow printed on its frame: the new filter must point the same way. Push it in until it "
    "clicks, close the panel, and hold the reset button for three seconds so the reminder light "
    "goes out. Filters last about six months in normal use and three in dusty rooms; washing them "
    "damages the fibres and voids the warranty. If the light keeps blinking after a reset, the "
    "sensor may be blocked by dust: wipe it gently with a dry cloth and try again."
)

DEFAULT_TEXTS = (
    "how do I reset my password",
    "best hiking trails near the coast",
    "What is the boiling point of water at high altitude?",
    "symptoms of vitamin D deficiency in adults",
    "Who wrote the novel about a white whale and a ship's captain?",
    "cheap flights london to lisbon in march",
    "Is it safe to eat raw cookie dough?",
    "python sort list of dicts by key",
    "The cat sat quietly on the warm windowsill, watching the rain.",
    "Our new espresso machine heats up in 25 seconds and pulls two shots at once.",
    "I ordered a size 9 but received a size 7, and the box was damaged.",
    "The meeting has been moved to Thursday at 3:30 pm in room 4B.",
    "Symptoms usually appear 2-14 days after exposure and include fever, cough and fatigue.",
    "Stainless steel water bottle, 750 ml, double-walled, keeps drinks cold for 24 h - blue",
    "def mean(values):\n    return sum(values) / len(values) if values else 0.0",
    "SELECT name, COUNT(*) FROM orders WHERE created_at >= '2024-01-01' GROUP BY name;",
    '<div class="price">€19.99 <span>incl. VAT</span></div>',
    "Error 0x80070005: access denied while installing update KB5034441",
    "THIS IS THE WORST SERVICE I HAVE EVER HAD!!! never again",
    "loved it 😍🔥 would totally buy again, 10/10 #happy",
    "Die Bahn hatte heute wieder zwanzig Minuten Verspätung.",
    "¿Dónde está la estación de tren más cercana?",
    "Le musée est fermé le mardi et les jours fériés.",
    "東京タワーは1958年に完成しました。",
    "今天天气很好，我们去公园散步吧。",
    "Москва — столица России.",
    "e = mc^2 relates mass and energy; c ≈ 299,792,458 m/s",
    "Call +1 (555) 010-4477 or email support@example.com before 5pm EST.",
    "Patient presents with acute onset dyspnea, SpO2 88% on room air, bilateral crackles.",
    "The defendant's motion to dismiss is denied; discovery shall close on June 30.",
    "a",
    "ok",
    "Photosynthesis turns light, water and carbon dioxide into glucose and oxygen.",
    "The 2008 financial crisis began in the US housing market and spread worldwide.",
    _PASSAGE,
    _REPORT,
    _MANUAL,
    " ".join((_PASSAGE, _MANUAL)),
    " ".join((_REPORT, _PASSAGE, _MANUAL)),
    "Q: Can I return an opened item? A: Yes, within 30 days, if all parts and the receipt are included.",
)


def calibration_texts(setting: str, model_dir: Path) -> list[str]:
    """The texts `handler.calibration` names: the default set, or a file of the archive (UTF-8, a
    byte-order mark skipped; one text a line, ended by a newline alone: a form feed or U+2028 inside
    a text does not end it; blank lines skipped; spaces cut around a text and around its first tab,
    which stays: a pair's; at most MAX_TEXTS are used)."""
    if setting == "default":
        return list(DEFAULT_TEXTS)
    path = Path(model_dir) / setting
    try:
        lines = re.split(r"\r?\n", path.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError) as error:
        raise CalibrationError(f"handler.calibration: cannot read {setting} in the archive: {error}") from error
    cleaned = ("\t".join(part.strip() for part in line.split("\t", 1)) for line in lines)
    texts = [text for text in cleaned if text.strip()][:MAX_TEXTS]
    if len(texts) < MIN_TEXTS:
        raise CalibrationError(f"handler.calibration: {setting} has {len(texts)} texts; give at least {MIN_TEXTS}")
    return texts


def calibration_pairs(texts: list[str]) -> list[tuple[str, str]]:
    """The texts as pairs: a file's own (`query<TAB>document` lines, every one), else each text
    beside the one half the set on. A file of pairs with a line that is not one is refused: read as
    single texts instead, its pairs would be wrong and nobody would know."""
    if not any("\t" in text for text in texts):
        half = len(texts) // 2
        return [(text, texts[(i + half) % len(texts)]) for i, text in enumerate(texts)]
    pairs = [tuple(part.strip() for part in text.split("\t", 1)) if "\t" in text else None for text in texts]
    broken = next((n for n, pair in enumerate(pairs, 1) if pair is None or not all(pair)), None)
    if broken is not None:
        raise CalibrationError(
            f"handler.calibration: text {broken} is not a query<TAB>document pair where others are; "
            "give every line as one (neither side empty), or none"
        )
    return pairs


def calibration_rows(tokenizer, inputs: list, max_length: int, options: dict, token_types: bool):
    """Token ids of texts (or pairs) as the model reads them, cut at `max_length`; each pair's token
    types too where the model reads them (else None). `options`: the task's tokenizer options
    (`special_tokens`; `truncates: False` for texts a cut would break, such as a chat-rendered pair
    whose end is where its score is read: those longer than `max_length` are left out, as a request
    with them is refused)."""
    truncates = options.get("truncates", True)
    if inputs and isinstance(inputs[0], tuple):
        firsts, seconds = zip(*inputs, strict=True)
        encoded = tokenizer(list(firsts), list(seconds), truncation=True, max_length=max_length)
        return encoded["input_ids"], encoded.get("token_type_ids") if token_types else None
    special = options.get("special_tokens", True)
    encoded = tokenizer(inputs, truncation=truncates, max_length=max_length, add_special_tokens=special)
    if truncates:
        return encoded["input_ids"], None
    rows = [row for row in encoded["input_ids"] if len(row) <= max_length]
    if len(rows) < min(MIN_TEXTS, len(inputs)):
        raise CalibrationError(
            f"handler.calibration: {len(rows)} of {len(inputs)} calibration texts fit in {max_length} tokens uncut "
            f"(this model's texts are never cut); give at least {MIN_TEXTS} shorter ones, or a longer largest bucket"
        )
    return rows, None
