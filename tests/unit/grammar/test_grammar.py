"""Constraints compiled with llguidance against the tiny package's own tokenizer (`daemon/grammar`):
what the sampler draws under the masks is accepted by the grammar (JSON that validates against its
schema, a regex's full match, one of the choices, a Lark sentence) for many seeds; ids past the
tokenizer's vocabulary are never allowed; a refused schema/regex/grammar is an InvalidArgument naming
the constraint's field, and nothing is cached for it; the cache compiles each constraint once and
stays bounded; a replayed prefix leaves the matcher where the undisturbed run had it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from calculet.common.errors import InvalidArgument
from calculet.daemon.grammar import GrammarCompiler, GrammarMatcher
from calculet.daemon.grammar.matcher import MatcherState
from calculet.daemon.package.manifest import load_manifest
from calculet.daemon.sampling import RowSampling, Sampler, SamplingParams
from calculet.daemon.sampling.constraint import (
    MAX_CHOICES,
    MAX_GRAMMAR_BYTES,
    Constraint,
    ConstraintKind,
    check_sizes,
)
from calculet.ops.sim_packages.build import build_sim_package

VOCAB = 600  # the model's; the tiny tokenizer has 512: 512..599 must never be allowed
MAX_STEPS = 120
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
REGEX = r"[a-c]{2,5}-[0-9]{3}"
CHOICES = ("yes", "no", "maybe so", 'say "hi"')
LARK = 'start: "(" num "," num ")"\nnum: /[0-9]{1,3}/'


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("grammar")
    build_sim_package("tiny", root / "tiny")
    return root / "tiny"


@pytest.fixture
def compiler(package: Path) -> GrammarCompiler:
    m = load_manifest(package)
    return GrammarCompiler(package / m.tokenizer.path, VOCAB, tuple(m.tokenizer.eos_token_ids))


@pytest.fixture(scope="module")
def decode(package: Path):  # type: ignore[no-untyped-def]
    tok = Tokenizer.from_file(str(package / load_manifest(package).tokenizer.path))
    return lambda ids: tok.decode(ids, skip_special_tokens=False)


def generate(
    compiler: GrammarCompiler,
    c: Constraint,
    seed: int,
    temperature: float = 1.0,
    prefix: tuple[int, ...] = (),
    tokenizer_size: int = 512,
) -> tuple[list[int], bool]:
    """Tokens the sampler draws from random logits under the constraint's masks (after `prefix`, which
    the grammar must allow, as if the model had written it), and whether the grammar ended them
    (stopped, or an EOS it allowed) within MAX_STEPS; ids from `tokenizer_size` on are never allowed."""
    m = compiler.matcher(c)
    eos = set(compiler.eos_ids)
    rng = np.random.default_rng(seed)
    sampler = Sampler(VOCAB, 1)
    out: list[int] = []
    for token in prefix:
        assert m.allowed()[token] and not m.would_stop(token), token
        m.consume(token)
        out.append(token)
    for step in range(MAX_STEPS):
        allowed = m.allowed()
        assert not allowed[tokenizer_size:].any()
        x = (rng.standard_normal((1, VOCAB)) * 2.0).astype(np.float32)
        token = sampler.sample(
            x, [RowSampling(SamplingParams(seed=seed, temperature=temperature), step, allowed=allowed)]
        )[0].token
        assert token is not None and allowed[token]
        if token in eos:
            assert m.would_stop(token) or m.state is MatcherState.ACTIVE
            return out, True
        stops = m.would_stop(token)
        m.consume(token)
        out.append(token)
        assert m.state is (MatcherState.STOPPED if stops else MatcherState.ACTIVE)
        if stops:
            return out, True
    return out, False


@pytest.mark.parametrize("seed", range(40))
def test_json_schema_output_parses_and_validates(compiler: GrammarCompiler, decode, seed: int) -> None:  # type: ignore[no-untyped-def]
    tokens, ended = generate(compiler, Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(SCHEMA)), seed)
    assert ended, decode(tokens)
    jsonschema.validate(json.loads(decode(tokens)), SCHEMA)


@pytest.mark.parametrize("seed", range(40))
def test_regex_choice_and_lark_outputs_match(compiler: GrammarCompiler, decode, seed: int) -> None:  # type: ignore[no-untyped-def]
    tokens, ended = generate(compiler, Constraint(ConstraintKind.REGEX, REGEX), seed)
    assert ended and re.fullmatch(REGEX, decode(tokens)), decode(tokens)
    tokens, ended = generate(compiler, Constraint(ConstraintKind.CHOICE, choices=CHOICES), seed)
    assert ended and decode(tokens) in CHOICES, decode(tokens)
    tokens, ended = generate(compiler, Constraint(ConstraintKind.LARK, LARK), seed)
    assert ended and re.fullmatch(r"\([0-9]{1,3},[0-9]{1,3}\)", decode(tokens)), decode(tokens)


def test_any_json_object_is_an_object(compiler: GrammarCompiler, decode) -> None:  # type: ignore[no-untyped-def]
    ended_count = 0
    for seed in range(20):
        tokens, ended = generate(compiler, Constraint(ConstraintKind.JSON_OBJECT), seed, temperature=0.3)
        text = decode(tokens)
        assert text.startswith("{"), text
        if ended:
            ended_count += 1
            assert isinstance(json.loads(text), dict)
    assert ended_count >= 5


@pytest.mark.parametrize(
    ("constraint", "field"),
    [
        (Constraint(ConstraintKind.JSON_SCHEMA, '{"type": "objx"}'), "constraint.json_schema"),
        (Constraint(ConstraintKind.JSON_SCHEMA, "not json"), "constraint.json_schema"),
        (Constraint(ConstraintKind.JSON_SCHEMA, '{"$ref": "#/nope"}'), "constraint.json_schema"),
        (Constraint(ConstraintKind.REGEX, "a(b"), "constraint.regex"),
        (Constraint(ConstraintKind.LARK, "start: foo"), "constraint.lark"),
        (Constraint(ConstraintKind.LARK, "start: ("), "constraint.lark"),
    ],
)
def test_a_refused_constraint_names_its_field_and_is_not_cached(
    compiler: GrammarCompiler, constraint: Constraint, field: str
) -> None:
    with pytest.raises(InvalidArgument, match=f"^{re.escape(field)}: .+"):
        compiler.matcher(constraint)
    assert len(compiler) == 0
    ok = compiler.matcher(Constraint(ConstraintKind.REGEX, REGEX))  # still compiles others
    assert ok.state is MatcherState.ACTIVE and len(compiler) == 1


def test_each_constraint_compiles_once_and_the_cache_is_bounded(package: Path) -> None:
    m = load_manifest(package)
    compiler = GrammarCompiler(package / m.tokenizer.path, VOCAB, (2,), capacity=2)
    a, b, c = (Constraint(ConstraintKind.CHOICE, choices=(w,)) for w in ("ab", "cd", "ef"))
    first, second = compiler.matcher(a), compiler.matcher(a)
    assert compiler.compiles == 1 and first is not second  # each sequence owns its own copy
    first.consume(first_token(first))
    assert second.state is MatcherState.ACTIVE and second.allowed().sum() == first_allowed_count(compiler, a)
    compiler.matcher(b)
    compiler.matcher(a)  # a is now the most recently used
    compiler.matcher(c)  # evicts b
    assert compiler.compiles == 3 and len(compiler) == 2
    compiler.matcher(a)
    assert compiler.compiles == 3
    compiler.matcher(b)
    assert compiler.compiles == 4 and len(compiler) == 2


def first_token(m: GrammarMatcher) -> int:
    return int(np.flatnonzero(m.allowed())[0])


def first_allowed_count(compiler: GrammarCompiler, c: Constraint) -> int:
    return int(compiler.matcher(c).allowed().sum())


@pytest.mark.parametrize("k", [0, 1, 3, 7])
def test_a_replayed_prefix_continues_as_the_undisturbed_run(compiler: GrammarCompiler, k: int) -> None:
    c = Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(SCHEMA))
    tokens, _ = generate(compiler, c, seed=3)
    undisturbed = compiler.matcher(c)
    masks = []
    for t in tokens:
        masks.append(undisturbed.allowed())
        undisturbed.consume(t)
    resumed = compiler.matcher(c)
    resumed.replay(tokens[:k])
    for i in range(k, len(tokens)):
        assert np.array_equal(resumed.allowed(), masks[i])
        resumed.consume(tokens[i])
    assert resumed.state is undisturbed.state


def test_a_replay_the_grammar_refuses_names_the_resume_token(compiler: GrammarCompiler, decode) -> None:  # type: ignore[no-untyped-def]
    m = compiler.matcher(Constraint(ConstraintKind.CHOICE, choices=("yes", "no")))
    not_allowed = int(np.flatnonzero(~m.allowed()[:512])[0])
    with pytest.raises(InvalidArgument, match=r"^resume_tokens\[0\]: .*constraint\.choice"):
        m.replay([not_allowed])
    tokens, _ = generate(compiler, Constraint(ConstraintKind.CHOICE, choices=("yes", "no")), seed=1)
    fresh = compiler.matcher(Constraint(ConstraintKind.CHOICE, choices=("yes", "no")))
    with pytest.raises(InvalidArgument, match=rf"^resume_tokens\[{len(tokens)}\]"):
        fresh.replay([*tokens, compiler.eos_ids[0]])  # the choice was complete: nothing may follow


def test_size_bounds_and_shapes_are_refused_naming_the_field() -> None:
    with pytest.raises(InvalidArgument, match=r"^constraint\.lark: at most 65536 bytes"):
        check_sizes("lark", "x" * (MAX_GRAMMAR_BYTES + 1), ())
    with pytest.raises(InvalidArgument, match=rf"^constraint\.choice: at most {MAX_CHOICES} choices"):
        check_sizes("choice", "", ["a"] * (MAX_CHOICES + 1))
    check_sizes("choice", "", ["a"] * MAX_CHOICES)
    with pytest.raises(InvalidArgument, match=r"^constraint\.choice"):
        Constraint(ConstraintKind.CHOICE)
    with pytest.raises(InvalidArgument, match=r"^constraint\.regex"):
        Constraint(ConstraintKind.REGEX)


@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from(
        [ConstraintKind.JSON_SCHEMA, ConstraintKind.REGEX, ConstraintKind.LARK, ConstraintKind.CHOICE]
    ),
    text=st.lists(
        st.sampled_from([*'ab{}[]()"\\:,*+?|^$.-/ \n%', "start:", '"type"', "é"]), min_size=1, max_size=20
    ).map("".join),
)
def test_any_text_compiles_or_is_invalid_argument_naming_the_field(
    package: Path, kind: ConstraintKind, text: str
) -> None:
    """Nothing llguidance is given escapes as another error (which the transport would report INTERNAL)."""
    m = load_manifest(package)
    compiler = GrammarCompiler(package / m.tokenizer.path, VOCAB, (2,))
    c = Constraint(kind, choices=(text,)) if kind is ConstraintKind.CHOICE else Constraint(kind, text)
    try:
        matcher = compiler.matcher(c)
    except InvalidArgument as exc:
        assert str(exc).startswith(f"{c.field}: ")
        assert len(compiler) == 0
    else:
        assert matcher.state in (MatcherState.ACTIVE, MatcherState.STOPPED)
