"""A request read for the model: its body taken by the first protocol of its route that accepts
it, its parameters checked, its texts tokenized as the task gives them to the model.

The loops call it before they queue or batch a request (`worker.reader.accept`), so the reading
of a request and the model call that follows are separate steps of the request path, as they are
separate in time wherever a queue stands between them (handlers/loops/scheduled_requests.py).
"""

import dataclasses
import time

from ts_compiled_handlers.protocols import Answered, RequestSpec, read_request, route_protocol
from ts_compiled_handlers.request.tokenizing import Accepted, TextTokenizer, Tokenized
from ts_compiled_handlers.runtime.json_text import as_json
from ts_compiled_handlers.tasks import Task
from ts_compiled_handlers.worker.messages import Incoming, Reply


@dataclasses.dataclass(frozen=True)
class RequestReader:
    """Reads requests for one worker's task, with its request spec and tokenizer."""

    task: Task
    spec: RequestSpec
    tokenize: TextTokenizer

    def accept(self, incoming: Incoming, index: int = 0, trace=None) -> Accepted | Reply:
        """The request read, checked and tokenized; or its reply already, where a protocol answers
        it without the model (its body JSON text, within the answer budget). RequestError for a
        refusal. `trace`: the request's RequestTrace, told of its tokenizing, where it is traced."""
        began = time.time_ns() if trace is not None else 0
        try:
            request = read_request(incoming.body, incoming.content_type, incoming.route, self.task.protocols, self.spec)
        except Answered as answered:
            protocol = route_protocol(incoming.route, self.task.protocols)
            return Reply(self.spec.budget.check_text(as_json(answered.body), protocol.texts_field))
        accepted = Accepted(index, request, self.tokenized(request), trace)
        if trace is not None:
            trace.read(began, len(accepted.token_ids), accepted.tokens)
        return accepted

    def tokenized(self, request) -> Tokenized:
        """The request's texts (as the task gives them to the model) tokenized, per its truncation."""
        self.task.check_request(request)
        truncate, side = request.params.get("truncate"), request.params.get("truncation_direction")
        if request.token_ids is not None:  # sent as token ids (the OpenAI embeddings body)
            return self.tokenize.ids(request.token_ids, truncate, side)
        tokenized = self.tokenize(self.task.model_texts(request), truncate, side)
        return tokenized if self.task.model_ids is None else self.task.model_ids(request, tokenized)
