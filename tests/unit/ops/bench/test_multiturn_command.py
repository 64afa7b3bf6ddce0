"""`calctl bench --workload multiturn` as a command, without processes: every bad flag or combination
is a usage error (exit 2) saying what is wrong; the defaults; a tokenizer that cannot be read is a
one-line refusal (exit 1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from calculet.ops.bench.multiturn.flags import spec_from
from calculet.ops.bench.multiturn.workload import ThinkTime
from calculet.ops.calctl import build_parser, main
from tests.unit.ops.calctl_fakes import usage_error

MT = ("bench", "--model", "tiny", "--workload", "multiturn", "--gateway", "http://127.0.0.1:9")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ((*MT, "--users", "0"), "argument --users: '0': must be at least 1"),
        ((*MT, "--turns", "two"), "argument --turns: 'two': expected a whole number"),
        ((*MT, "--system-tokens", "-5"), "argument --system-tokens: '-5': must be at least 0"),
        ((*MT, "--user-tokens", "0"), "argument --user-tokens: '0': must be at least 1"),
        ((*MT, "--answer-tokens", "1.5"), "argument --answer-tokens: '1.5': expected a whole number"),
        ((*MT, "--think-time", "2:1"), "argument --think-time: '2:1': expected finite seconds with 0 <= LO <= HI"),
        ((*MT, "--think-time", "soon"), "argument --think-time: 'soon': expected S or LO:HI seconds"),
        ((*MT, "--stagger", "-1"), "argument --stagger: '-1': must be a finite number >= 0"),
        ((*MT, "--stagger", "inf"), "argument --stagger: 'inf': must be a finite number >= 0"),
        (("bench", "--model", "tiny", "--workload", "chat"), "argument --workload: invalid choice: 'chat'"),
        ((*MT, "--concurrency", "4"), "--concurrency: not with --workload multiturn"),
        ((*MT, "--rate", "2", "--burstiness", "1"), "--rate, --burstiness: not with --workload multiturn"),
        ((*MT, "--requests", "10"), "--requests: not with --workload multiturn"),
        ((*MT, "--prompt-len", "8", "--output-len", "8"), "--prompt-len, --output-len: not with --workload multiturn"),
        ((*MT, "--prompts", "p.jsonl"), "--prompts: not with --workload multiturn"),
        ((*MT, "--vocab", "512"), "--vocab: not with --workload multiturn"),
        (("bench", "--model", "tiny", "--workload", "multiturn"), "give --gateway URL"),
        (("bench", "--model", "tiny", "--workload", "multiturn", "--daemon", "unix:b.sock"), "give --gateway URL"),
        (("bench", "--model", "tiny", "--users", "3"), "--users: only with --workload multiturn"),
        (("bench", "--model", "tiny", "--workload", "requests", "--turns", "3", "--send-user"),
         "--turns, --send-user: only with --workload multiturn"),
        (("bench", "--model", "tiny", "--tokenizer", "t.json"), "--tokenizer: only with --workload multiturn"),
        (("bench", "--workload", "multiturn", "--gateway", "http://127.0.0.1:9"), "required: --model"),
    ],
)  # fmt: skip
def test_bad_flags_are_usage_errors(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str) -> None:
    assert message in usage_error(capsys, *argv)


def test_the_defaults() -> None:
    spec = spec_from(build_parser().parse_args([*MT, "--seed", "4"]))
    assert (spec.users, spec.turns, spec.system_tokens, spec.user_tokens, spec.answer_tokens) == (8, 5, 1000, 100, 100)
    assert (spec.think, spec.stagger_s, spec.seed) == (ThinkTime(0.5, 1.5), 0.0, 4)


def test_every_flag_parses() -> None:
    args = build_parser().parse_args(
        [*MT, "--users", "3", "--turns", "2", "--system-tokens", "0", "--user-tokens", "7", "--answer-tokens", "9",
         "--think-time", "0.25:0.5", "--stagger", "1.5", "--send-user", "--tokenizer", "t.json"]
    )  # fmt: skip
    spec = spec_from(args)
    assert (spec.users, spec.turns, spec.system_tokens, spec.user_tokens, spec.answer_tokens) == (3, 2, 0, 7, 9)
    assert (spec.think, spec.stagger_s) == (ThinkTime(0.25, 0.5), 1.5)
    assert args.send_user is True and args.tokenizer == Path("t.json")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "invalid_argument: --tokenizer {path}: cannot be read"),
        (b"{not json", "failed_precondition: --tokenizer"),
    ],
)
def test_an_unusable_tokenizer_file_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes | None, message: str
) -> None:
    path = tmp_path / "tokenizer.json"
    if content is not None:
        path.write_bytes(content)
    # --daemon names the status boards, so the gateway (nothing listens on port 9) is never asked
    code = main([*MT, "--daemon", "unix:/nonexistent.sock", "--tokenizer", str(path), "--no-progress"])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert err.startswith("calctl: " + message.format(path=path)) and len(err.strip().splitlines()) == 1, err
