"""Chat messages to a prompt, through the model's own chat template (text generation)."""

from typing import Any

from ts_compiled_handlers.request.payload import RequestError, is_unicode_text

ROLES = ("system", "user", "assistant")


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
    messages = check_messages(messages)
    try:
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as error:  # the template's own checks (roles, order) raise what they like
        raise RequestError(400, f"the model's chat template refused these messages ({type(error).__name__})") from error
    bos = tokenizer.bos_token
    if bos and prompt.startswith(bos) and tokenizer("x")["input_ids"][0] == tokenizer.bos_token_id:
        prompt = prompt[len(bos) :]  # tokenizing adds it again
    return prompt


def messages_to_inputs(tokenizer, value: Any) -> Any:
    """`{"messages": [...], ...}` -> `{"inputs": the chat prompt, ...}`; other bodies as they are."""
    if not (isinstance(value, dict) and "messages" in value):
        return value
    if "inputs" in value:
        raise RequestError(400, "send 'inputs' (a prompt) or 'messages' (a chat), not both", "inputs")
    prompt = chat_prompt(tokenizer, value["messages"])
    return {**{key: item for key, item in value.items() if key != "messages"}, "inputs": prompt}
