"""OpenAI request bodies: strict types, OpenAI's ranges, unknown fields ignored, and nothing but
`InvalidArgument` (naming the field) for a bad body."""

from __future__ import annotations

import contextlib
import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.common.errors import InvalidArgument
from calculet.gateway.api.schemas import ChatCompletionRequest, CompletionRequest, parse_body

CHAT: dict[str, Any] = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
TEXT: dict[str, Any] = {"model": "tiny", "prompt": "once upon"}


def _raw(body: Any) -> bytes:
    return json.dumps(body).encode()


def _chat(**fields: Any) -> ChatCompletionRequest:
    return parse_body(ChatCompletionRequest, _raw({**CHAT, **fields}))


def _text(**fields: Any) -> CompletionRequest:
    return parse_body(CompletionRequest, _raw({**TEXT, **fields}))


def _refused(cls: type, body: Any) -> str:
    with pytest.raises(InvalidArgument) as info:
        parse_body(cls, body if isinstance(body, bytes) else _raw(body))
    return str(info.value)


def test_valid_bodies_keep_their_values() -> None:
    req = _chat(temperature=0.5, top_p=1, n=3, seed=-7, stop=["x", "y"], max_tokens=9, stream=True,
                stream_options={"include_usage": True}, priority=-1000, top_k=-1)  # fmt: skip
    assert (req.model, req.temperature, req.top_p, req.n, req.seed) == ("tiny", 0.5, 1.0, 3, -7)
    assert req.stop_strings() == ("x", "y") and req.include_usage and req.stream
    assert (req.max_tokens, req.priority, req.top_k) == (9, -1000, -1)
    assert _chat(stop="END").stop_strings() == ("END",)
    assert _chat().stop_strings() == ()
    assert not _chat(stream=True).include_usage


@pytest.mark.parametrize("cls, base", [(ChatCompletionRequest, CHAT), (CompletionRequest, TEXT)])
def test_unknown_fields_are_ignored(cls: type, base: dict[str, Any]) -> None:
    # Known fields not served (logit_bias, response_format json) are 400s now (test_refused_fields.py).
    req = parse_body(cls, _raw({**base, "some_future_field": {"type": "json"}, "zzz": None}))
    assert req.model == "tiny"
    assert not hasattr(req, "zzz")
    msg = parse_body(
        ChatCompletionRequest, _raw({**CHAT, "messages": [{"role": "user", "content": "hi", "refusal": None}]})
    )
    assert msg.messages[0].template_view() == {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_tokens", "5"),
        ("n", True),
        ("stop", 5),
        ("stop", [1, 2]),
        ("messages", {"role": "user", "content": "hi"}),
        ("model", None),
        ("seed", 1.5),
        ("seed", 2.0),
        ("temperature", "0.5"),
        ("stream", 1),
        ("logprobs", 1),
        ("max_completion_tokens", 3.0),
        ("stream_options", True),
        ("user", 5),
    ],
)
def test_wrong_types_name_the_field(field: str, value: Any) -> None:
    message = _refused(ChatCompletionRequest, {**CHAT, field: value})
    assert message.startswith(field), message


@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", 3),
        ("temperature", -0.1),
        ("top_p", 0),
        ("top_p", 1.5),
        ("n", 0),
        ("n", 17),
        ("top_logprobs", 21),
        ("top_logprobs", -1),
        ("presence_penalty", 3),
        ("frequency_penalty", -2.5),
        ("priority", 5000),
        ("priority", -1001),
        ("max_tokens", 0),
        ("max_tokens", 2**32),
        ("seed", 2**64),
        ("seed", -(2**63) - 1),
        ("min_p", 1.5),
        ("top_k", -2),
        ("repetition_penalty", 0),
        ("model", ""),
        ("stop", ["s"] * 17),
        ("messages", []),
    ],
)
def test_out_of_range_names_the_field(field: str, value: Any) -> None:
    message = _refused(ChatCompletionRequest, {**CHAT, field: value})
    assert message.startswith(field), message


def test_extreme_legal_values_are_accepted() -> None:
    req = _chat(temperature=0, top_p=1e-9, n=16, seed=2**64 - 1, top_logprobs=20, logprobs=True, priority=1000)
    assert (req.n, req.seed, req.logprobs_count()) == (16, 2**64 - 1, 20)
    assert _chat(seed=-(2**63)).seed == -(2**63)


def test_text_completion_wrong_types_and_ranges() -> None:
    assert _refused(CompletionRequest, {**TEXT, "logprobs": True}).startswith("logprobs")
    assert _refused(CompletionRequest, {**TEXT, "logprobs": 21}).startswith("logprobs")
    assert _refused(CompletionRequest, {**TEXT, "prompt": 5}).startswith("prompt")
    assert _refused(CompletionRequest, {**TEXT, "prompt": [1, "a"]}).startswith("prompt")
    assert _refused(CompletionRequest, {"model": "tiny"}).startswith("prompt")
    assert _refused(CompletionRequest, {**TEXT, "best_of": 17}).startswith("best_of")


@pytest.mark.parametrize("raw", [b"{bad", b"", b"\xff\xfe", b'{"model": "tiny",}', b"nul"])
def test_malformed_json_is_invalid_argument(raw: bytes) -> None:
    assert "JSON" in _refused(ChatCompletionRequest, raw)


@pytest.mark.parametrize("body", [[CHAT], "a string", 5, None])
def test_a_body_that_is_not_an_object_is_refused(body: Any) -> None:
    assert _refused(ChatCompletionRequest, body).startswith("body")
    assert _refused(CompletionRequest, body).startswith("body")


# Messages ------------------------------------------------------------------------------------


def test_content_parts_are_joined_for_the_template() -> None:
    content = [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}, {"type": "text", "text": "!"}]
    req = _chat(messages=[{"role": "user", "content": content, "name": "bob"}, {"role": "assistant"}])
    assert req.messages[0].template_view() == {"role": "user", "content": "Hello, world!", "name": "bob"}
    assert req.messages[1].template_view() == {"role": "assistant", "content": ""}


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
        {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}},
        {"type": "text"},
        {"type": "text", "text": 5},
    ],
)
def test_a_non_text_part_is_refused(part: Any) -> None:
    req = _chat(messages=[{"role": "user", "content": [{"type": "text", "text": "look"}, part]}])
    with pytest.raises(InvalidArgument, match=r"content\[1\]"):
        req.messages[0].template_view()


def test_a_part_that_is_not_an_object_is_refused_at_parse() -> None:
    body = {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, "b"]}]}
    assert _refused(ChatCompletionRequest, body).startswith("messages.0.content")


def test_message_fields_are_typed() -> None:
    assert _refused(ChatCompletionRequest, {**CHAT, "messages": [{"role": 5, "content": "x"}]}).startswith("messages")
    assert _refused(ChatCompletionRequest, {**CHAT, "messages": [{"content": "x"}]}).startswith("messages")
    assert _refused(ChatCompletionRequest, {**CHAT, "messages": [{"role": "user", "content": 5}]}).startswith(
        "messages"
    )


# Derived values ------------------------------------------------------------------------------


def test_logprobs_count() -> None:
    assert _chat().logprobs_count() is None
    assert _chat(logprobs=True).logprobs_count() == 0
    assert _chat(logprobs=True, top_logprobs=5).logprobs_count() == 5
    assert _chat(logprobs=False, top_logprobs=0).logprobs_count() is None
    with pytest.raises(InvalidArgument, match="top_logprobs"):
        _chat(top_logprobs=3).logprobs_count()
    assert _text().logprobs_count() is None
    assert _text(logprobs=0).logprobs_count() == 0
    assert _text(logprobs=4).logprobs_count() == 4


def test_token_limit() -> None:
    assert _chat().token_limit() is None
    assert _chat(max_tokens=7).token_limit() == 7
    assert _chat(max_completion_tokens=9).token_limit() == 9
    assert _chat(max_tokens=7, max_completion_tokens=9).token_limit() == 9
    assert _chat(max_tokens=9, max_completion_tokens=7).token_limit() == 7
    assert _text().token_limit() == 16  # OpenAI's legacy default
    assert _text(max_tokens=100).token_limit() == 100


@pytest.mark.parametrize(
    "prompt, expected",
    [
        ("text", ["text"]),
        ("", [""]),
        (["a", "b"], ["a", "b"]),
        ([1, 2, 3], [[1, 2, 3]]),
        ([[1, 2], [3]], [[1, 2], [3]]),
    ],
)
def test_prompts(prompt: Any, expected: list[Any]) -> None:
    assert _text(prompt=prompt).prompts() == expected


@pytest.mark.parametrize(
    "fields, name",
    [
        ({"prompt": []}, "prompt"),
        ({"echo": True}, "echo"),
        ({"suffix": "tail"}, "suffix"),
        ({"best_of": 2}, "best_of"),
        ({"best_of": 1, "n": 2}, "best_of"),
    ],
)
def test_prompts_refused(fields: dict[str, Any], name: str) -> None:
    with pytest.raises(InvalidArgument, match=name):
        _text(**fields).prompts()


def test_best_of_equal_to_n_is_served() -> None:
    assert _text(best_of=3, n=3).prompts() == ["once upon"]


# Any JSON value in any field: a parsed request or InvalidArgument, nothing else ----------------

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
_CHAT_FIELDS = sorted(
    set(ChatCompletionRequest.model_fields) | {"messages.0", "messages.0.content", "messages.0.content.0"}
)
_TEXT_FIELDS = sorted(set(CompletionRequest.model_fields) | {"prompt.0", "stream_options.include_usage"})


def _put(body: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """`body` with `value` at a dotted path (containers of the right kind created or replaced on the way)."""
    body = json.loads(json.dumps(body))
    keys = path.split(".")
    node: Any = body
    for key, nxt in itertools.pairwise(keys):
        want: type = list if nxt.isdigit() else dict
        if key.isdigit():
            while len(node) <= int(key):
                node.append(want())
            if not isinstance(node[int(key)], want):
                node[int(key)] = want()
            node = node[int(key)]
        else:
            if not isinstance(node.get(key), want):
                node[key] = want()
            node = node[key]
    last = keys[-1]
    if last.isdigit():
        while len(node) <= int(last):
            node.append(None)
        node[int(last)] = value
    else:
        node[last] = value
    return body


def _use(req: ChatCompletionRequest | CompletionRequest) -> None:
    """Everything the service calls on a parsed request."""
    req.stop_strings()
    _ = req.include_usage
    req.token_limit()
    req.logprobs_count()
    if isinstance(req, ChatCompletionRequest):
        for m in req.messages:
            m.template_view()
    else:
        req.prompts()


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_any_json_in_any_field_is_parsed_or_invalid_argument(data: st.DataObject) -> None:
    cls, base, fields = data.draw(
        st.sampled_from([(ChatCompletionRequest, CHAT, _CHAT_FIELDS), (CompletionRequest, TEXT, _TEXT_FIELDS)])
    )
    body: dict[str, Any] = base
    for path in data.draw(st.lists(st.sampled_from(fields), min_size=1, max_size=3, unique=True), label="fields"):
        body = _put(body, path, data.draw(_JSON, label=path))
    try:
        _use(parse_body(cls, _raw(body)))
    except InvalidArgument as err:
        assert str(err)


@settings(max_examples=100, deadline=None)
@given(raw=st.binary(max_size=40) | st.text(max_size=40).map(str.encode))
def test_any_bytes_are_parsed_or_invalid_argument(raw: bytes) -> None:
    for cls in (ChatCompletionRequest, CompletionRequest):
        with contextlib.suppress(InvalidArgument):
            parse_body(cls, raw)
