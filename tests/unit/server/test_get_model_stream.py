"""GetModel's stream (issue 21): the daemon sends tokenizer.json in pieces so that no message nears
gRPC's default 4 MiB receive limit, and the client joins them back byte for byte.

First the two wire halves on their own (`daemon.wire_views.model_info_to_pb` and
`client.convert.model_info_from_stream`), from a small `ModelInfoView` factory; then the real
servicer over a calsim `DeviceCore` on an in-process grpc.aio server on a Unix socket (`ServedCore`),
called through stock channels (no receive-limit option), with the tiny package's tokenizer.json
padded with JSON whitespace past 4 MiB. The real Qwen3 package (5.36 MB of tokenizer.json) is
fetched through a daemon process in tests/integration/test_daemon_api.py.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tokenizers import Tokenizer

from calculet.client import DaemonClient
from calculet.client.convert import model_info_from_stream
from calculet.common.errors import CalculetError, ErrorKind
from calculet.daemon.core.config import DaemonConfig
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.core.model_state import ModelState
from calculet.daemon.core.observe.status import ModelInfoView
from calculet.daemon.wire_views import TOKENIZER_PIECE_BYTES, model_info_to_pb
from calculet.ops.sim_packages.build import build_sim_package
from calculet.v1 import observe_pb2

from .served_core import CALL_S, ServedCore

STOCK_LIMIT = 4 * 1024 * 1024  # gRPC's default max_receive_message_length
MiB = 1 << 20
TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def view(tokenizer_json: bytes, chat_template: str = TEMPLATE) -> ModelInfoView:
    return ModelInfoView(
        alias="qwen", generation=3, state=ModelState.READY, package_name="qwen3-30b-a3b", package_hash="ab" * 32,
        model_role="llm", family="qwen3_moe", quantization="bf16", vocab_size=151_936, context=4096, lanes=4,
        eos_token_ids=(151_645, 151_643), bos_token_id=None, pad_token_id=151_643, model_max_length=4096,
        tokenizer_json=tokenizer_json, chat_template=chat_template, prefill_fixed_ms=17.0,
        prefill_ms_per_token=4.8, decode_step_ms=17.2, prefill_chunk_tokens=64,
    )  # fmt: skip


def pattern(size: int) -> bytes:
    """`size` bytes that show a piece dropped, repeated or out of order."""
    return b"".join(i.to_bytes(4, "little") for i in range(math.ceil(size / 4)))[:size]


# ---- the two halves of the wire -------------------------------------------------------------


@pytest.mark.parametrize(
    "size", [0, 1, TOKENIZER_PIECE_BYTES - 1, TOKENIZER_PIECE_BYTES, 5_360_000, 9 * MiB + 7], ids=str
)
def test_a_tokenizer_of_any_size_round_trips_in_messages_under_4_mib(size: int) -> None:
    data = pattern(size)
    messages = list(model_info_to_pb(view(data)))
    assert all(m.ByteSize() < STOCK_LIMIT for m in messages)
    assert max(m.ByteSize() for m in messages) <= TOKENIZER_PIECE_BYTES + 1024  # a piece, the template, the summary
    after_first = max(0, size - (TOKENIZER_PIECE_BYTES - len(TEMPLATE.encode())))  # the template shares a piece
    assert len(messages) == 1 + math.ceil(after_first / TOKENIZER_PIECE_BYTES)
    first, rest = messages[0], messages[1:]
    assert first.HasField("model") and first.chat_template == TEMPLATE and first.tokenizer_size == size
    assert not any(m.HasField("model") or m.chat_template or m.tokenizer_size for m in rest)
    info = model_info_from_stream(messages)
    assert info.tokenizer_json == data
    assert (info.alias, info.chat_template, info.vocab_size, info.pad_token_id) == ("qwen", TEMPLATE, 151_936, 151_643)


def test_a_tokenizer_of_one_piece_comes_whole_in_one_message_as_before_the_stream() -> None:
    (only,) = model_info_to_pb(view(b'{"version": "1.0"}'))
    assert (only.tokenizer_json, only.chat_template, only.model.alias) == (b'{"version": "1.0"}', TEMPLATE, "qwen")


def test_a_long_template_comes_alone_and_every_message_still_fits() -> None:
    template = "{{ messages }}" + " " * (3 * MiB)  # inline in a 4 MiB manifest at most: never split
    messages = list(model_info_to_pb(view(pattern(6 * MiB), template)))
    assert messages[0].tokenizer_json == b"" and messages[0].chat_template == template
    assert all(m.ByteSize() < STOCK_LIMIT for m in messages)
    info = model_info_from_stream(messages)
    assert (info.tokenizer_json, info.chat_template) == (pattern(6 * MiB), template)


def test_a_stream_missing_a_piece_or_the_summary_is_an_internal_error() -> None:
    messages = list(model_info_to_pb(view(pattern(3 * MiB))))
    for broken, reason in (
        (messages[:-1], "arrived with"),
        ([messages[0], *messages[2:]], "arrived with"),
        (messages[1:], "did not start"),
        ([], "did not start"),
    ):
        with pytest.raises(CalculetError, match=reason) as info:
            model_info_from_stream(broken)
        assert info.value.kind is ErrorKind.INTERNAL


def test_the_one_message_of_a_daemon_before_the_stream_is_still_read() -> None:
    old = next(model_info_to_pb(view(b"{}")))
    old.ClearField("tokenizer_size")  # the unary GetModel had no size field
    assert model_info_from_stream([old]).tokenizer_json == b"{}"


# ---- the real servicer, stock channels ------------------------------------------------------


def pad_tokenizer(package: Path, size: int) -> bytes:
    """Pad `package`'s tokenizer.json with trailing JSON whitespace to `size` bytes (still a valid
    tokenizer) and record its new size and hash in the manifest."""
    manifest_path = package / "calculet-package.json"
    manifest = json.loads(manifest_path.read_text())
    path = package / manifest["tokenizer"]["path"]
    data = path.read_bytes()
    data += b" " * (size - len(data))
    path.write_bytes(data)
    (entry,) = (f for f in manifest["files"] if f["path"] == manifest["tokenizer"]["path"])
    entry.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    manifest_path.write_text(json.dumps(manifest, indent=2))
    return data


@pytest.fixture(scope="module")
def big_tokenizer_board(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServedCore, bytes]]:
    root = tmp_path_factory.mktemp("models")
    build_sim_package("tiny", root / "tiny")
    data = pad_tokenizer(root / "tiny", 9 * MiB + 7)  # more than twice the stock limit, not a whole piece
    config = DaemonConfig(models_root=root, models=(("tiny", "tiny"),), device_options={"time_scale": 0.0})
    core = DeviceCore(config)
    core.start()
    board = ServedCore(core, tmp_path_factory.mktemp("sock") / "d.sock")
    yield board, data
    board.close()


def test_the_servicer_streams_a_9_mib_tokenizer_to_a_stock_channel(
    big_tokenizer_board: tuple[ServedCore, bytes],
) -> None:
    board, data = big_tokenizer_board
    with grpc.insecure_channel(board.target) as channel:  # no options: gRPC's default 4 MiB receive limit
        call = channel.unary_stream(
            "/calculet.v1.Daemon/GetModel",
            request_serializer=observe_pb2.GetModelRequest.SerializeToString,
            response_deserializer=observe_pb2.GetModelResponse.FromString,
        )
        messages = list(call(observe_pb2.GetModelRequest(alias="tiny"), timeout=CALL_S))
    assert len(messages) == 10 and all(m.ByteSize() < STOCK_LIMIT for m in messages)
    assert messages[0].tokenizer_size == len(data)
    assert b"".join(m.tokenizer_json for m in messages) == data
    info = model_info_from_stream(messages)
    assert Tokenizer.from_str(info.tokenizer_json.decode("utf-8")).get_vocab_size() > 0  # what the gateway does


def test_the_client_library_fetches_it_with_grpcs_default_receive_limit(
    big_tokenizer_board: tuple[ServedCore, bytes],
) -> None:
    board, data = big_tokenizer_board
    with DaemonClient(board.target, timeout=CALL_S) as client:
        info = client.get_model("tiny")
    assert info.tokenizer_json == data and info.chat_template and info.package_hash


def test_an_unknown_alias_is_not_found_before_any_message(big_tokenizer_board: tuple[ServedCore, bytes]) -> None:
    board, _ = big_tokenizer_board
    with pytest.raises(grpc.RpcError) as info:
        list(board.stub.GetModel(observe_pb2.GetModelRequest(alias="ghost"), timeout=CALL_S))
    assert info.value.code() is grpc.StatusCode.NOT_FOUND
