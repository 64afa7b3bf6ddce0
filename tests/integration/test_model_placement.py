"""Issue 20, placement by demand on real processes: the gateway switches boards between models as
their demand alternates, within its bounds, and two gateways never switch one board twice.

- A/B soak (M5): two boards start on qwen3-30b-a3b (dual chip, min-boards 1); requests for
  qwen3-4b (single chip) wait in the gateway's queue while a board switches to it, and a burst of
  qwen requests beyond one board's lanes takes it back once qwen3-4b has gone idle. Ten switches:
  no request fails, every text equals an undisturbed board's, the board that never switches keeps
  serving qwen (the same-model path), and after every return both boards are idle (no job, lane or
  buffer held), their chip memory is back at its baseline, and their file descriptors and threads
  are within the lazy growth of their pools (`helpers.LAZY_GROWTH`).
- Thrash bound: A B A A C traffic over three models on two boards switches each board at most
  once per residency window (each switch in the boards' audit trails).
- Compare-and-swap: two gateways, each with a request for a different model no board serves, and
  one board: exactly one switch happens; the other gateway's placer lost the race.

The boards run at calsim time scale 0.8, so a burst of long qwen requests stays in flight for
seconds whatever the machine's speed, and the placer sees it (64 tokens at 0.8 are as long in wall
time as 256 at 0.2, for a quarter of the sampling and streaming CPU).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from calculet.client import DaemonClient
from calculet.v1.common_pb2 import RESET_KIND_SWITCH
from tests.integration.conftest import DaemonProcess
from tests.integration.gateway_process import GatewayProcess, Oracle
from tests.integration.helpers import assert_idle_soon, process_usage, usage_back_to, within

pytestmark = pytest.mark.integration
StartDaemon = Callable[..., DaemonProcess]
StartGateway = Callable[..., GatewayProcess]
PACED = ("--time-scale", "0.8")
MESSAGES = [{"role": "user", "content": "Name a prime number."}]
QWEN_BURST = 10  # over the qwen package's 4 lanes: requests wait beyond them (pressure)
QWEN_TOKENS = 64  # three waves on 4 lanes: about a second each at time scale 0.8
DENSE_TOKENS = 6


def gateway_config(path: Path, targets: list[str], models: dict[str, str], **settings: object) -> Path:
    """A gateway TOML: the daemons, placement by demand, `settings`, and a catalog of `models`
    (alias -> package, each table's extra keys appended after '|', e.g. 'qwen|min-boards = 1')."""
    lines = ["[gateway]", f"daemons = {targets!r}".replace("'", '"'), 'placement = "demand"']
    lines += [f"{key.replace('_', '-')} = {value!r}" for key, value in settings.items()]
    for alias, spec in models.items():
        package, _, extra = spec.partition("|")
        lines += [f"[gateway.models.{alias}]", f'package = "{package}"', *([extra] if extra else [])]
    path.write_text("\n".join(lines) + "\n")
    return path


def chat(gateway: GatewayProcess, model: str, seed: int, tokens: int) -> str:
    answer = gateway.openai(timeout=180).chat.completions.create(
        model=model,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=tokens,
        seed=seed,
        temperature=0.9,
        extra_body={"ignore_eos": True},
    )
    text = answer.choices[0].message.content
    assert text is not None and answer.usage is not None
    return text


def expected_text(oracle: Oracle, seed: int, tokens: int) -> str:
    prompt = oracle.chat_prompt(MESSAGES)
    return oracle.text(oracle.tokens(prompt, seed=seed, max_tokens=tokens, temperature=0.9, ignore_eos=True))


def serving(daemon: DaemonProcess) -> list[str]:
    with DaemonClient(daemon.target) as client:
        return [m.alias for m in client.status().models]


def chip_memory(daemon: DaemonProcess) -> list[int]:
    """Chip memory in use on a board, once it is idle (no job, lane or buffer held)."""
    with DaemonClient(daemon.target) as client:
        assert_idle_soon(client)
        return [int(c.dram_used_bytes) for c in client.status().device.chips]


def switches(daemon: DaemonProcess) -> list[tuple[float, bool, str]]:
    with DaemonClient(daemon.target) as client:
        history = client.status().resets.history
    return [(e.at.ToSeconds() + e.at.nanos / 1e9, e.ok, e.message) for e in history if e.kind == RESET_KIND_SWITCH]


def test_alternating_demand_switches_a_board_ten_times_with_exact_texts_and_no_leak(
    start_daemon: StartDaemon, start_gateway: StartGateway, tmp_path: Path
) -> None:
    x = start_daemon("--model", "qwen=qwen", *PACED)
    y = start_daemon("--board", "1", "--model", "qwen=qwen", *PACED)
    reference = start_daemon("--board", "2", "--model", "dense=dense0")
    qwen_oracle, dense_oracle = Oracle(y.target, "qwen"), Oracle(reference.target, "dense")
    qwen_expected = {s: expected_text(qwen_oracle, s, QWEN_TOKENS) for s in range(QWEN_BURST)}
    dense_expected = {s: expected_text(dense_oracle, s, DENSE_TOKENS) for s in range(2)}
    config = gateway_config(
        tmp_path / "gateway.toml",
        [x.target, y.target],
        {"qwen": "qwen|min-boards = 1", "dense": "dense0"},
        min_residency=0.5,
        idle_ttl=0.5,
        placement_wait=120.0,
    )
    gateway = start_gateway("--config", str(config))
    baseline: dict[str, tuple[list[int], tuple[int, int]]] = {}
    with concurrent.futures.ThreadPoolExecutor(QWEN_BURST) as pool:
        for cycle in range(5):
            dense = list(pool.map(lambda s: chat(gateway, "dense", s, DENSE_TOKENS), range(2)))
            assert dense == [dense_expected[0], dense_expected[1]], f"cycle {cycle}: dense texts"
            (moved,) = [d for d in (x, y) if serving(d) == ["dense"]]
            stayed = y if moved is x else x
            assert serving(stayed) == ["qwen"], "min-boards 1 keeps qwen on the other board"
            qwen = list(pool.map(lambda s: chat(gateway, "qwen", s, QWEN_TOKENS), range(QWEN_BURST)))
            assert qwen == [qwen_expected[s] for s in range(QWEN_BURST)], f"cycle {cycle}: qwen texts"
            gateway.wait_until(lambda body: body["models"].get("qwen") == 2, "qwen back on both boards", 120)
            for d in (x, y):
                chips = chip_memory(d)
                if d.target not in baseline:
                    baseline[d.target] = (chips, process_usage(d.proc.pid))
                    continue
                base_chips, base_usage = baseline[d.target]
                assert chips == base_chips, f"cycle {cycle}: chip memory back at its baseline on {d.target}"
                usage = usage_back_to(d.proc.pid, base_usage)
                assert within(usage, base_usage), f"cycle {cycle}: fds/threads {usage} over {base_usage} on {d.target}"
    made = switches(x) + switches(y)
    assert len(made) >= 10 and all(ok for _, ok, _ in made), made
    assert gateway.ready()["models"] == {"qwen": 2}


def test_a_b_a_a_c_traffic_switches_each_board_at_most_once_per_residency_window(
    start_daemon: StartDaemon, start_gateway: StartGateway, tmp_path: Path
) -> None:
    residency = 3.0
    x = start_daemon("--model", "qwen=qwen")
    y = start_daemon("--board", "1", "--model", "qwen=qwen")
    config = gateway_config(
        tmp_path / "gateway.toml",
        [x.target, y.target],
        {"qwen": "qwen", "dense": "dense0", "dense1": "dense1"},
        min_residency=residency,
        idle_ttl=0.0,
        placement_wait=120.0,
    )
    gateway = start_gateway("--config", str(config))
    for model in ("qwen", "dense", "qwen", "qwen", "dense1", "dense", "qwen", "dense1", "qwen"):
        assert chat(gateway, model, 1, 4)
    for board in (x, y):
        times = sorted(t for t, ok, _ in switches(board))
        assert all(later - earlier >= residency for earlier, later in itertools.pairwise(times)), times
    assert len(switches(x)) + len(switches(y)) >= 3  # the traffic did make the boards switch


def test_two_gateways_asking_opposite_switches_of_one_board_switch_it_once(
    start_daemon: StartDaemon, start_gateway: StartGateway, tmp_path: Path
) -> None:
    board = start_daemon("--model", "qwen=qwen")
    catalog = {"qwen": "qwen", "dense": "dense0", "dense1": "dense1"}
    # qwen was ready before the gateways looked: either may take the board now; what either places
    # then stays for the residency, so the loser cannot switch the board back within the test.
    settings = {"min_residency": 600.0, "idle_ttl": 0.0, "placement_wait": 5.0}
    one = start_gateway("--config", str(gateway_config(tmp_path / "one.toml", [board.target], catalog, **settings)))
    two = start_gateway("--config", str(gateway_config(tmp_path / "two.toml", [board.target], catalog, **settings)))
    results: dict[str, object] = {}
    go = threading.Barrier(2)

    def ask(gateway: GatewayProcess, model: str) -> None:
        go.wait()
        try:
            results[model] = chat(gateway, model, 1, 4)
        except Exception as err:  # the loser's request waits out its 5 s and gets 503
            results[model] = err

    threads = [threading.Thread(target=ask, args=(g, m)) for g, m in ((one, "dense"), (two, "dense1"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    made = switches(board)
    assert len(made) == 1 and made[0][1], made
    won = serving(board)[0]
    assert isinstance(results[won], str)
    lost = next(m for m in ("dense", "dense1") if m != won)
    assert "503" in str(results[lost]) or "got no board" in str(results[lost]), results[lost]
    metrics = "\n".join(g.http(5).get("/metrics").text for g in (one, two))
    counted = [
        line
        for line in metrics.splitlines()
        if line.startswith("calculet_gateway_model_switches_total{") and f'model="{lost}"' in line
    ]
    assert any('result="lost"' in line for line in counted), counted
