"""`POST /tokenize` and `POST /detokenize` (vLLM's shapes; docs/gateway.md "Tokenize"): the ids are
exactly those a completion request submits (the board's prompt is compared), the text is the ids'
text, and nothing runs on a board."""

from __future__ import annotations

from typing import Any

import pytest

from calculet.ops.sim_packages.chat_template import QWEN_TEMPLATE_RESOURCE, load_chat_template
from tests.unit.gateway.fakes import ALIAS, CONTEXT, EOS, FakeDaemon
from tests.unit.gateway.harness import gateway

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def test_a_prompt_is_tokenized_as_completions_encode_it() -> None:
    daemon = FakeDaemon("a")
    with gateway(daemon) as client:
        resp = client.post("/tokenize", json={"model": ALIAS, "prompt": "Hi!"})
        assert resp.status_code == 200
        assert resp.json() == {"count": 3, "max_model_len": CONTEXT, "tokens": [72, 105, 33], "token_strs": None}
        client.post("/v1/completions", json={"model": ALIAS, "prompt": "Hi!", "max_tokens": 1})
        strs = client.post("/tokenize", json={"model": ALIAS, "prompt": "Hi!", "return_token_strs": True}).json()
    assert list(daemon.submitted[0].job.prompt_tokens) == [72, 105, 33]
    assert strs["token_strs"] == ["H", "i", "!"]
    assert len(daemon.submitted) == 1  # tokenizing ran nothing on the board


@pytest.mark.parametrize(
    "extra",
    [{}, {"tools": [TOOL]}, {"chat_template_kwargs": {"enable_thinking": False}}, {"add_generation_prompt": False}],
)
def test_messages_are_tokenized_as_a_chat_request_renders_them(extra: dict[str, Any]) -> None:
    daemon = FakeDaemon("a", chat_template=load_chat_template(QWEN_TEMPLATE_RESOURCE), context=4096)
    with gateway(daemon) as client:
        got = client.post("/tokenize", json={"model": ALIAS, "messages": MESSAGES, **extra}).json()
        chat = client.post(
            "/v1/chat/completions", json={"model": ALIAS, "messages": MESSAGES, "max_tokens": 1, **extra}
        )
        assert chat.status_code == 200
        text = client.post("/detokenize", json={"model": ALIAS, "tokens": got["tokens"]}).json()["prompt"]
    assert got["tokens"] == list(daemon.submitted[0].job.prompt_tokens) and got["count"] == len(got["tokens"])
    assert got["max_model_len"] == 4096
    assert text.startswith("<|im_start|>system\nBe brief.")  # special tokens written out
    assert ("# Tools" in text) == ("tools" in extra)
    assert text.endswith("<think>\n\n</think>\n\n") == ("chat_template_kwargs" in extra)


def test_detokenize_skips_padding_ids_and_refuses_ids_outside_the_vocabulary() -> None:
    daemon = FakeDaemon("a")  # tokenizer: 259 ids; the model's vocabulary: 300
    with gateway(daemon) as client:
        assert client.post("/detokenize", json={"model": ALIAS, "tokens": [72, 299, EOS, 105]}).json() == {
            "prompt": "H<|im_end|>i"
        }
        assert client.post("/detokenize", json={"model": ALIAS, "tokens": []}).json() == {"prompt": ""}
        resp = client.post("/detokenize", json={"model": ALIAS, "tokens": [72, 300]})
        assert resp.status_code == 400 and resp.json()["error"]["message"].startswith("tokens[1]: token id 300")
        assert client.post("/detokenize", json={"model": ALIAS, "tokens": [-1]}).status_code == 400


@pytest.mark.parametrize(
    ("body", "status", "match"),
    [
        ({"model": ALIAS}, 400, "exactly one of prompt and messages"),
        ({"model": ALIAS, "prompt": "x", "messages": MESSAGES}, 400, "exactly one of prompt and messages"),
        ({"model": ALIAS, "prompt": 5}, 400, "prompt"),
        ({"model": "nope", "prompt": "x"}, 404, "'nope'"),
        (
            {"model": ALIAS, "messages": MESSAGES, "chat_template_kwargs": {"tools": []}},
            400,
            "chat_template_kwargs.tools",
        ),
    ],
)
def test_bad_tokenize_requests(body: dict[str, Any], status: int, match: str) -> None:
    daemon = FakeDaemon("a")
    with gateway(daemon) as client:
        resp = client.post("/tokenize", json=body)
    assert resp.status_code == status and match in resp.json()["error"]["message"]


def test_a_model_no_board_serves_now_is_503() -> None:
    daemon = FakeDaemon("a", ready=False)
    with gateway(daemon) as client:
        resp = client.post("/tokenize", json={"model": ALIAS, "prompt": "x"})
    assert resp.status_code == 503
