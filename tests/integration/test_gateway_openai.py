"""The official `openai` package against a real gateway over two real daemons (calsim, time scale 0).

Every text is checked against an oracle computed without the gateway: the same prompt tokenized
with the package's own tokenizer and template (from GetModel), generated directly on a daemon with
the same seed, and decoded with `tokenizers`. So a gateway that mis-tokenizes, mis-detokenizes,
drops, duplicates or reorders text fails here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from calculet.client import DaemonClient
from tests.integration.conftest import DaemonProcess
from tests.integration.gateway_process import GatewayProcess, Oracle
from tests.integration.local_fleet import local_fleet

pytestmark = pytest.mark.integration
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a story about a fox."}]


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, models_root: Path
) -> Iterator[tuple[list[DaemonProcess], GatewayProcess, Oracle]]:
    """Two tiny boards and a gateway, shared by this module's tests (each leaves them serving)."""
    boards = [["--board", str(i), "--model", "tiny=tiny"] for i in range(2)]
    with local_fleet(tmp_path_factory.mktemp("tiny-fleet"), models_root, boards) as (daemons, gateway):
        yield daemons, gateway, Oracle(daemons[0].target, "tiny")


def test_chat_non_stream_and_stream_match_the_daemon(fleet: tuple[Any, GatewayProcess, Oracle]) -> None:
    _, gateway, oracle = fleet
    client = gateway.openai()
    prompt = oracle.chat_prompt(MESSAGES)
    expected_tokens = oracle.tokens(prompt, seed=42, max_tokens=40)
    expected = oracle.text(expected_tokens)

    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=40, seed=42)  # type: ignore[arg-type]
    assert r.object == "chat.completion" and r.model == "tiny"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == expected
    assert r.choices[0].finish_reason == ("stop" if expected_tokens[-1] in oracle.eos else "length")
    assert r.usage is not None
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(prompt), len(expected_tokens))
    assert r.usage.total_tokens == len(prompt) + len(expected_tokens)

    stream = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_completion_tokens=40, seed=42, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [r.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == len(expected_tokens)


def test_completions_n2_seeds_and_logprobs(fleet: tuple[Any, GatewayProcess, Oracle]) -> None:
    _, gateway, oracle = fleet
    client = gateway.openai()
    prompt_text = "Once upon a time"
    prompt = list(oracle.tokenizer.encode(prompt_text, add_special_tokens=False).ids)
    r = client.completions.create(model="tiny", prompt=prompt_text, max_tokens=24, n=2, seed=7, logprobs=2)
    assert [c.index for c in r.choices] == [0, 1]
    for i, choice in enumerate(r.choices):
        tokens = oracle.tokens(prompt, seed=7 + i, max_tokens=24)  # choice i samples with seed + i
        assert choice.text == oracle.text(tokens)
        assert choice.logprobs is not None and len(choice.logprobs.token_logprobs or []) == len(tokens)
        assert all(lp is not None and lp <= 0 for lp in choice.logprobs.token_logprobs or [])
        assert all(len(top) <= 2 for top in choice.logprobs.top_logprobs or [])
    assert r.usage is not None and r.usage.prompt_tokens == len(prompt)
    assert r.usage.completion_tokens == sum(len(c.logprobs.token_logprobs or []) for c in r.choices if c.logprobs)

    again = client.completions.create(model="tiny", prompt=prompt_text, max_tokens=24, n=2, seed=7)
    assert [c.text for c in again.choices] == [c.text for c in r.choices]  # same seed, same text

    chat = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=8,
        seed=3,
        logprobs=True,
        top_logprobs=3,  # type: ignore[arg-type]
    )
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == chat.usage.completion_tokens  # type: ignore[union-attr]
    assert all(len(entry.top_logprobs) == 3 for entry in content)


def test_stop_strings_cut_the_text(fleet: tuple[Any, GatewayProcess, Oracle]) -> None:
    _, gateway, oracle = fleet
    client = gateway.openai()
    prompt = oracle.chat_prompt(MESSAGES)
    full = oracle.text(oracle.tokens(prompt, seed=9, max_tokens=60))
    stop = next(full[i : i + 3] for i in range(10, len(full) - 3) if full[i : i + 3].strip() == full[i : i + 3])
    expected = full[: full.find(stop)]
    for stream in (False, True):
        r = client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=60,
            seed=9,
            stop=[stop, "\x00never"],
            stream=stream,  # type: ignore[arg-type]
        )
        if stream:
            chunks = list(r)  # type: ignore[arg-type]
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            reason = next(c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason)
        else:
            text, reason = r.choices[0].message.content, r.choices[0].finish_reason  # type: ignore[union-attr]
        assert (text, reason) == (expected, "stop")


def test_models_health_ready(fleet: tuple[Any, GatewayProcess, Oracle], models_root: Path) -> None:
    daemons, gateway, _ = fleet
    manifest_hash = hashlib.sha256((models_root / "tiny" / "calculet-package.json").read_bytes()).hexdigest()
    for d in daemons:  # the gateway matches boards' packages by this hash before failing over
        assert DaemonClient(d.target).get_model("tiny").package_hash == manifest_hash
    models = gateway.openai().models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert models.data[0].model_extra is not None and models.data[0].model_extra["max_model_len"] == 256
    with gateway.http() as http:
        assert http.get("/health").json() == {"status": "ok"}
        ready = http.get("/ready").json()
        assert ready["status"] == "ready" and ready["models"] == {"tiny": 2}
        assert sorted(ready["boards"].values()) == ["up", "up"]
        assert "calculet_gateway_boards" in http.get("/metrics").text


def test_bad_requests_get_openai_errors_and_the_gateway_keeps_serving(
    fleet: tuple[Any, GatewayProcess, Oracle],
) -> None:
    _, gateway, _ = fleet
    good = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    cases: list[tuple[bytes | dict[str, Any], int, str]] = [
        ({**good, "model": "nope"}, 404, "model_not_found"),
        ({**good, "messages": [{"role": "user", "content": "word " * 400}]}, 400, "invalid_argument"),
        ({**good, "max_tokens": 300}, 400, "invalid_argument"),
        (b'{"model": "tiny", "messages": [', 400, "invalid_argument"),
        ({**good, "max_tokens": "2"}, 400, "invalid_argument"),
        ({**good, "temperature": "hot"}, 400, "invalid_argument"),
        ({**good, "messages": "hi"}, 400, "invalid_argument"),
        ({**good, "n": 0}, 400, "invalid_argument"),
        ({"messages": good["messages"]}, 400, "invalid_argument"),
        ({**good, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, 400,
         "invalid_argument"),
    ]  # fmt: skip
    with gateway.http() as http:
        for body, status, code in cases:
            raw = body if isinstance(body, bytes) else json.dumps(body).encode()
            r = http.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
            assert r.status_code == status, (body, r.text)
            error = r.json()["error"]
            assert set(error) == {"message", "type", "param", "code"} and error["code"] == code, error
            assert error["message"]
        assert http.post("/v1/nothing-here", json={}).status_code == 404
        # Unknown fields are ignored, and the gateway still serves after all of the above.
        ok = http.post("/v1/chat/completions", json={**good, "some_future_field": {"x": 1}})
        assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] in ("stop", "length")
