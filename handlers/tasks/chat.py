"""Chat messages to a prompt, through the model's own chat template (text generation).

The prompt is a string that is tokenized as a whole, where a special token's string (`<|im_start|>`,
`</s>`) becomes that control token. Only the template may write them: a client who could would
forge roles and turns. So in message content every special token's string is broken by a zero-width
space after its first character (`<\u200b|im_start|>`): the model reads it as text, as vLLM and TGI
tokenize user text with `split_special_tokens`. Clients who mean control tokens send `inputs`, a
prompt of their own, which is theirs to write.
"""

import re
from typing import Any

from ts_compiled_handlers.request.payload import RequestError, is_unicode_text

ROLES = ("system", "user", "assistant")
BREAK = "\u200b"  # zero-width space, put inside a special token's string in message content


def check_messages(messages: Any) -> list[dict[str, str]]:
    """A non-empty list of {"role": system | user | assistant, "content": text}."""
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, '\'messages\' must be a non-empty list of {"role", "content"} objects', "messages")
    for position, message in enumerate(messages):
        if not (isinstance(message, dict) and set(message) == {"role", "content"}):
            raise RequestError(
                400, f"'messages'[{position}] must be an object with exactly 'role' and 'content'", "messages"
            )
        if message["role"] not in ROLES or not isinstance(message["content"], str):
            raise RequestError(
                400, f"'messages'[{position}]: role is one of {', '.join(ROLES)}, content a string", "messages"
            )
        if not is_unicode_text(message["content"]):
            raise RequestError(400, f"'messages'[{position}] holds a lone surrogate, not Unicode text", "messages")
    return messages


def chat_prompt(tokenizer, messages: Any) -> str:
    """The prompt the tokenizer's chat template makes of `messages`, ready for generation, without
    the first special token that tokenizing adds again."""
    if not tokenizer.chat_template:
        raise RequestError(
            400, "this model's tokenizer has no chat template: send 'inputs' (a prompt) instead", "inputs"
        )
    specials = special_tokens(tokenizer)
    messages = [
        {**message, "content": as_text(tokenizer, message["content"], specials)} for message in check_messages(messages)
    ]
    try:
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as error:  # the template's own checks (roles, order) raise what they like
        raise RequestError(400, f"the model's chat template refused these messages ({type(error).__name__})") from error
    bos = tokenizer.bos_token
    if bos and prompt.startswith(bos) and tokenizer("x")["input_ids"][0] == tokenizer.bos_token_id:
        prompt = prompt[len(bos) :]  # tokenizing adds it again
    return prompt


def as_text(tokenizer, content: str, specials: tuple[re.Pattern | None, set[int]]) -> str:
    """Message content with every special token's string broken, so that it tokenizes as text; 400
    where one still makes a control token (a tokenizer that matches them after normalizing)."""
    strings, ids = specials
    text = content
    while strings and strings.search(text):  # a break can complete another token's string: again
        text = strings.sub(lambda found: found[0][0] + BREAK + found[0][1:], text)
    if ids and not ids.isdisjoint(tokenizer(text, add_special_tokens=False)["input_ids"]):
        raise RequestError(400, "a message's content makes one of the model's control tokens", "messages")
    return text


def special_tokens(tokenizer) -> tuple[re.Pattern | None, set[int]]:
    """A pattern of the tokenizer's special tokens' strings, longest first (one character long ones
    left out: nothing fits inside them), and their ids but the unknown token's."""
    added = {index: token.content for index, token in tokenizer.added_tokens_decoder.items() if token.special}
    strings = sorted({content for content in added.values() if len(content) > 1 and BREAK not in content}, key=len)
    pattern = re.compile("|".join(re.escape(content) for content in reversed(strings))) if strings else None
    return pattern, set(added) - {tokenizer.unk_token_id}


def messages_to_inputs(tokenizer, value: Any) -> Any:
    """`{"messages": [...], ...}` -> `{"inputs": the chat prompt, ...}`; other bodies as they are."""
    if not (isinstance(value, dict) and "messages" in value):
        return value
    if "inputs" in value:
        raise RequestError(400, "send 'inputs' (a prompt) or 'messages' (a chat), not both", "inputs")
    prompt = chat_prompt(tokenizer, value["messages"])
    return {**{key: item for key, item in value.items() if key != "messages"}, "inputs": prompt}
