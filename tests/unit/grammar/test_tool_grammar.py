"""The grammar of tool calls (`gateway/api/tool_grammar.py`), compiled by the board's compiler
against the tiny package's tokenizer (whose tags are text) and against it with the tags added as
tokens (Qwen3's case): whatever the logits, what the sampler draws under `required` and named is
`<tool_call>` blocks that the gateway's parser reads as calls of the offered functions whose
arguments validate against their parameters; under `auto` it is free text, or free text then such
calls once the model began one (one only without `parallel_tool_calls`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from tokenizers import Tokenizer

from calculet.daemon.grammar import GrammarCompiler
from calculet.daemon.package.manifest import load_manifest
from calculet.daemon.sampling.constraint import Constraint, ConstraintKind
from calculet.gateway.api.tool_grammar import TEXT_TAGS, CallTags, call_tags, tool_call_constraint
from calculet.gateway.api.tool_schemas import NamedToolChoice, Tool
from calculet.gateway.text.tool_calls import CALL_OPEN, ToolCallParser
from tests.unit.grammar.test_grammar import VOCAB, compiler, decode, generate, package  # noqa: F401  (fixtures)

WEATHER = {
    "type": "object",
    "properties": {"city": {"enum": ["Oslo", "Rome"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [
    Tool.model_validate({"type": "function", "function": {"name": "weather", "parameters": WEATHER}}),
    Tool.model_validate({"type": "function", "function": {"name": "now"}}),
]
PARAMETERS: dict[str, dict[str, Any]] = {"weather": WEATHER, "now": {"type": "object", "maxProperties": 0}}


def board_constraint(choice: Any, parallel: bool = False, tags: CallTags = TEXT_TAGS) -> Constraint:
    c = tool_call_constraint(TOOLS, choice, parallel, tags)
    assert c is not None and c.kind == "lark"
    return Constraint(ConstraintKind.LARK, c.text)


def read(text: str, cut: bool = False) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """(content, calls) of an answer: every call's arguments validate against its parameters (`cut`:
    the answer ran out of steps, and its last call, cut short, is left out)."""
    parser = ToolCallParser(parallel=True)
    piece, rest = parser.feed(text), parser.finish()
    calls = piece.calls + rest.calls
    content = piece.content + rest.content
    if cut:
        content = content.split(CALL_OPEN)[0].rstrip()  # a block cut before its head stays content
        if calls and not calls[-1].complete:
            calls.pop()
    assert all(call.complete for call in calls)
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), PARAMETERS[call.name])
    return content, [(call.name, json.loads(call.arguments)) for call in calls]


def calls_of(text: str) -> list[tuple[str, dict[str, Any]]]:
    content, calls = read(text)
    assert not content.strip(), content  # nothing but calls
    return calls


@pytest.mark.parametrize("seed", range(12))
def test_a_named_function_is_called_with_valid_arguments(compiler: GrammarCompiler, decode, seed: int) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    named = NamedToolChoice.model_validate({"type": "function", "function": {"name": "weather"}})
    tokens, ended = generate(compiler, board_constraint(named), seed)
    text = decode(tokens)
    assert ended, text
    ((name, arguments),) = calls_of(text)
    assert name == "weather"
    jsonschema.validate(arguments, WEATHER)


@pytest.mark.parametrize("seed", range(12))
def test_required_calls_one_of_the_offered_functions(compiler: GrammarCompiler, decode, seed: int) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    tokens, ended = generate(compiler, board_constraint("required"), seed)
    text = decode(tokens)
    assert ended, text
    ((name, arguments),) = calls_of(text)
    jsonschema.validate(arguments, PARAMETERS[name])


def test_no_constraint_for_none_or_no_tools() -> None:
    assert tool_call_constraint(TOOLS, "none", True) is None
    assert tool_call_constraint(None, "required", True) is None
    assert tool_call_constraint(None, "auto", True) is None


def test_parallel_calls_may_follow_the_first_only_when_asked() -> None:
    one = tool_call_constraint(TOOLS, "required", False)
    more = tool_call_constraint(TOOLS, "required", True)
    assert one is not None and more is not None
    assert one.text.startswith("start: call\n") and more.text.startswith('start: call ("\\n" call)*\n')


VOCAB_WITH_TAGS = 514  # the tiny tokenizer's 512 and the two tags


@pytest.fixture(scope="module")
def token_tags(
    package: Path,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[GrammarCompiler, CallTags, Tokenizer]:
    """The tiny tokenizer with `<tool_call>` and `</tool_call>` added as tokens (as Qwen3 has them),
    its compiler, the tags `call_tags` finds in it, and the tokenizer."""
    m = load_manifest(package)
    tok = Tokenizer.from_file(str(package / m.tokenizer.path))
    tok.add_special_tokens(["<tool_call>", "</tool_call>"])
    path = tmp_path_factory.mktemp("tags") / "tokenizer.json"
    tok.save(str(path))
    tags = call_tags(tok.token_to_id)
    assert tags.special and tags.open == f"<[{tok.token_to_id('<tool_call>')}]>"
    return GrammarCompiler(path, VOCAB, tuple(m.tokenizer.eos_token_ids)), tags, tok


@pytest.mark.parametrize("seed", range(8))
def test_auto_answers_free_text_that_never_holds_a_stray_tag(compiler: GrammarCompiler, decode, seed: int) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    tokens, ended = generate(compiler, board_constraint("auto", parallel=True), seed)
    content, _ = read(decode(tokens), cut=not ended)
    assert CALL_OPEN not in content and len(tokens) > 0


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_a_call_begun_under_auto_is_constrained_from_its_tag(
    compiler: GrammarCompiler,  # noqa: F811
    decode,  # noqa: F811
    package: Path,  # noqa: F811
    seed: int,
    parallel: bool,
) -> None:  # type: ignore[no-untyped-def]
    """The model wrote some text and the opening tag (a prefix here): from there only calls that
    validate, then the end (after one call without `parallel_tool_calls`)."""
    tok = Tokenizer.from_file(str(package / load_manifest(package).tokenizer.path))
    prefix = tuple(tok.encode("Let me look. " + CALL_OPEN, add_special_tokens=False).ids)
    tokens, ended = generate(compiler, board_constraint("auto", parallel), seed, prefix=prefix)
    text = decode(tokens)
    content, calls = read(text, cut=parallel)  # random logits may go on calling
    assert content == "Let me look." and calls, text
    assert (ended and len(calls) == 1) or parallel


@pytest.mark.parametrize("seed", range(8))
def test_with_tags_as_tokens_auto_and_required_hold(
    token_tags: tuple[GrammarCompiler, CallTags, Tokenizer], seed: int
) -> None:
    """Qwen3's case: the tags are tokens, named by id. Under `auto` the model may open a call after
    any text (the token is the trigger) and every call it opens validates; `required` answers calls."""
    tagged, tags, tok = token_tags
    opening = int(tags.open.strip("<[]>"))

    def run(choice: str, parallel: bool, prefix: tuple[int, ...] = ()) -> tuple[list[int], bool]:
        c = board_constraint(choice, parallel, tags)
        return generate(tagged, c, seed, prefix=prefix, tokenizer_size=VOCAB_WITH_TAGS)

    free, ended = run("auto", True)
    content, _ = read(tok.decode(free, skip_special_tokens=False), cut=not ended)
    assert CALL_OPEN not in content
    begun, ended = run("auto", False, prefix=(opening,))
    assert ended and begun.count(opening) == 1 and len(calls_of(tok.decode(begun, skip_special_tokens=False))) == 1
    required, ended = run("required", False)
    assert ended and required[0] == opening and len(calls_of(tok.decode(required, skip_special_tokens=False))) == 1
