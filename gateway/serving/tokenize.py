"""`/tokenize` and `/detokenize` (vLLM's endpoints): a model's tokenizer and chat template applied
exactly as a completion request applies them, without running anything on a board.

Which package: the one a serving board reports (GetModel once per board generation, as for any
request); during a rollout with several packages of one alias, the first serving board's. Nothing
is placed or loaded: a model no board serves now is a 503 (a catalog model is not loaded for this).
The prompt text is bounded as a completion's is (too long to fit the context in any tokenization:
400) and encoded on the tokenizer's threads (`TokenizePool`).
"""

from __future__ import annotations

from typing import Any

from calculet.common.errors import CalculetError, InvalidArgument, Unavailable
from calculet.gateway.api.tokenize_schemas import DetokenizeRequest, TokenizeRequest
from calculet.gateway.errors import ModelNotFound
from calculet.gateway.serving.service import ChatRender, GatewayService
from calculet.gateway.text.model_text import ModelText


async def model_text(service: GatewayService, alias: str) -> ModelText:
    """The tokenizer and template of `alias` as a serving board's package has them.

    Raises:
        ModelNotFound: no board and no catalog entry knows the model (and some board is up).
        Unavailable: it is served nowhere now, or no board is reachable.
        CalculetError: every serving board's GetModel failed (the first failure).
    """
    failure: CalculetError | None = None
    for board in service.fleet.serving(alias):
        try:
            return (await service.fleet.packages.of(board, alias)).text
        except CalculetError as err:
            failure = failure or err
    if failure is not None:
        raise failure
    if alias in service.fleet.known_models() or any(m.alias == alias for m in service.catalog):
        raise Unavailable(f"model {alias!r} is not ready on any board")
    if not service.fleet.any_up():
        raise Unavailable("no board is reachable")  # the model may well exist: nobody can say
    raise ModelNotFound(f"model {alias!r} does not exist on any board")


async def tokenize(service: GatewayService, req: TokenizeRequest) -> dict[str, Any]:
    """vLLM's `/tokenize` answer: `tokens`, `count`, `max_model_len` (and `token_strs` if asked).

    Raises:
        InvalidArgument: the template refuses the messages, or the text cannot fit the context.
        CalculetError: as `model_text`; Overloaded from the tokenizer's budget.
    """
    text = await model_text(service, req.model)
    if req.messages is not None:
        views = [m.template_view() for m in req.messages]
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        prompt = ChatRender(views, req.add_generation_prompt, tools, req.chat_template_kwargs).prompt(text)
    else:
        prompt = req.prompt or ""
    tokens = await service.encode(text, prompt)
    answer: dict[str, Any] = {"count": len(tokens), "max_model_len": text.facts.context, "tokens": tokens}
    answer["token_strs"] = [text.token_text(t) for t in tokens] if req.return_token_strs else None
    return answer


async def detokenize(service: GatewayService, req: DetokenizeRequest) -> dict[str, Any]:
    """vLLM's `/detokenize` answer: `prompt`, the ids' text (special tokens written out; ids past
    the tokenizer's own range, the model's padding ids, are nothing).

    Raises:
        InvalidArgument: an id outside the model's vocabulary.
        CalculetError: as `model_text`.
    """
    text = await model_text(service, req.model)
    bad = next((i for i, t in enumerate(req.tokens) if t >= text.facts.vocab_size), None)
    if bad is not None:
        raise InvalidArgument(f"tokens[{bad}]: token id {req.tokens[bad]} is outside the vocabulary")
    ids = [t for t in req.tokens if t < text.tokenizer_size]
    return {"prompt": text.tokenizer.decode(ids, skip_special_tokens=False) if ids else ""}
