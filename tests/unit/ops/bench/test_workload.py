"""Workload generation: synthetic lengths and token ids within their bounds and seeded; length specs;
JSONL prompt files, with every kind of bad line refused by file and line number."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from calculet.common.errors import InvalidArgument
from calculet.ops.bench.workload import BenchRequest, LengthSpec, cycle_to, load_jsonl, synthetic_requests


def test_synthetic_lengths_and_token_ids_stay_in_their_bounds_and_reach_both_ends() -> None:
    reqs = synthetic_requests(300, LengthSpec(3, 9), LengthSpec(1, 4), 50, random.Random(1))
    prompt_lens = {len(r.prompt_tokens or ()) for r in reqs}
    outputs = {r.max_tokens for r in reqs}
    assert prompt_lens == set(range(3, 10))
    assert outputs == {1, 2, 3, 4}
    ids = {t for r in reqs for t in r.prompt_tokens or ()}
    assert min(ids) >= 0 and max(ids) <= 49 and len(ids) > 40
    assert [r.index for r in reqs] == list(range(300))
    assert all(r.prompt_text is None for r in reqs)


def test_synthetic_fixed_lengths_and_seeding() -> None:
    a = synthetic_requests(20, LengthSpec(16, 16), LengthSpec(8, 8), 1000, random.Random(4))
    b = synthetic_requests(20, LengthSpec(16, 16), LengthSpec(8, 8), 1000, random.Random(4))
    c = synthetic_requests(20, LengthSpec(16, 16), LengthSpec(8, 8), 1000, random.Random(5))
    assert a == b and a != c
    assert all(len(r.prompt_tokens or ()) == 16 and r.max_tokens == 8 for r in a)
    with pytest.raises(InvalidArgument, match="vocab: must be at least 1"):
        synthetic_requests(1, LengthSpec(1, 1), LengthSpec(1, 1), 0, random.Random(0))


@pytest.mark.parametrize(
    ("text", "spec"), [("7", LengthSpec(7, 7)), ("2:5", LengthSpec(2, 5)), ("3:3", LengthSpec(3, 3))]
)
def test_length_specs(text: str, spec: LengthSpec) -> None:
    assert LengthSpec.parse(text, "--output-len") == spec


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0", "1 <= LO <= HI"),
        ("-4", "1 <= LO <= HI"),
        ("5:2", "1 <= LO <= HI"),
        ("abc", "expected N or LO:HI"),
        ("1:", "expected N or LO:HI"),
        (":3", "expected N or LO:HI"),
        ("1.5", "expected N or LO:HI"),
    ],
)
def test_bad_length_specs_name_the_flag(text: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=f"--prompt-len '{text}': .*{message}"):
        LengthSpec.parse(text, "--prompt-len")


def _file(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_jsonl_prompts_as_text_or_tokens_with_or_without_max_tokens(tmp_path: Path) -> None:
    path = _file(
        tmp_path,
        '{"prompt": "Hello there", "max_tokens": 5, "id": "extra keys are ignored"}',
        "",
        '{"prompt_tokens": [1, 2, 3]}',
        '  {"prompt_tokens": [9], "max_tokens": 1}  ',
    )
    reqs = load_jsonl(path, LengthSpec(12, 12), random.Random(0))
    assert reqs == [
        BenchRequest(0, 5, prompt_text="Hello there"),
        BenchRequest(1, 12, prompt_tokens=(1, 2, 3)),
        BenchRequest(2, 1, prompt_tokens=(9,)),
    ]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('"text"', "expected a JSON object, got str"),
        ('{"max_tokens": 4}', 'exactly one of "prompt"'),
        ('{"prompt": "a", "prompt_tokens": [1]}', 'exactly one of "prompt"'),
        ('{"prompt": ""}', '"prompt" must be a non-empty string'),
        ('{"prompt": 5}', '"prompt" must be a non-empty string'),
        ('{"prompt_tokens": []}', '"prompt_tokens" must be a non-empty list'),
        ('{"prompt_tokens": "1 2"}', '"prompt_tokens" must be a non-empty list'),
        ('{"prompt_tokens": [1, -2]}', '"prompt_tokens" holds -2'),
        ('{"prompt_tokens": [1, 2.5]}', '"prompt_tokens" holds 2.5'),
        ('{"prompt_tokens": [true]}', '"prompt_tokens" holds True'),
        ('{"prompt": "a", "max_tokens": 0}', '"max_tokens" must be a whole number >= 1, got 0'),
        ('{"prompt": "a", "max_tokens": "5"}', "got '5'"),
        ('{"prompt": "a", "max_tokens": true}', "got True"),
    ],
)
def test_bad_jsonl_lines_are_refused_with_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = _file(tmp_path, '{"prompt": "fine"}', "", line)
    with pytest.raises(InvalidArgument, match=f"prompts.jsonl:3: .*{message}".replace("[", r"\[")) as info:
        load_jsonl(path, LengthSpec(4, 4), random.Random(0))
    assert str(info.value).startswith(str(path))


def test_empty_or_missing_files_are_refused(tmp_path: Path) -> None:
    empty = _file(tmp_path, "", "  ")
    with pytest.raises(InvalidArgument, match="holds no prompt"):
        load_jsonl(empty, LengthSpec(4, 4), random.Random(0))
    with pytest.raises(InvalidArgument, match=r"nope\.jsonl: cannot be read: No such file"):
        load_jsonl(tmp_path / "nope.jsonl", LengthSpec(4, 4), random.Random(0))
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InvalidArgument, match=r"bin\.jsonl: cannot be read"):
        load_jsonl(binary, LengthSpec(4, 4), random.Random(0))


def test_cycle_reuses_the_prompts_in_order_and_reindexes() -> None:
    base = [BenchRequest(0, 1, prompt_tokens=(1,)), BenchRequest(1, 2, prompt_text="b")]
    out = cycle_to(base, 5)
    assert [r.index for r in out] == [0, 1, 2, 3, 4]
    assert [r.max_tokens for r in out] == [1, 2, 1, 2, 1]
    assert out[3].prompt_text == "b"
