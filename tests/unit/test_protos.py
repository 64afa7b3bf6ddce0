"""The wire protocol: committed generated code matches the sources, the service has exactly the
planned RPCs each with a plane, every element is documented, enums and presence follow the
conventions of common.proto, messages round-trip, and `calculet.v1` imports from outside the repo.
Also the generator itself (`calculet.ops.protogen`): discovery, errors, stale-file removal.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import EnumDescriptor
from hypothesis import given, settings
from hypothesis import strategies as st

import calculet.v1
from calculet.common.errors import ErrorKind
from calculet.ops import protogen
from calculet.ops.protogen import ProtoGenError
from calculet.v1 import (
    common_pb2,
    daemon_pb2,
    daemon_pb2_grpc,
    inference_pb2,
    observe_pb2,
    operate_pb2,
    options_pb2,
)

ROOT = protogen.find_proto_root()
SERVICE = daemon_pb2.DESCRIPTOR.services_by_name["Daemon"]
MODULES = (common_pb2, daemon_pb2, inference_pb2, observe_pb2, operate_pb2, options_pb2)

INF, OBS, OPS = options_pb2.PLANE_INFERENCE, options_pb2.PLANE_OBSERVE, options_pb2.PLANE_OPERATE
EXPECTED_PLANES = {
    "Submit": INF, "Wait": INF, "Follow": INF, "Cancel": INF,
    "Health": OBS, "Status": OBS, "WatchLoad": OBS, "GetModel": OBS,
    "Load": OPS, "Unload": OPS, "Drain": OPS, "Resume": OPS, "Reset": OPS, "InjectFault": OPS,
}  # fmt: skip
SERVER_STREAMING = {"Wait", "WatchLoad", "Load", "GetModel", "Follow"}
CLIENT_STREAMING = {"Follow"}

UINT32 = st.integers(min_value=0, max_value=2**32 - 1)
FLOAT32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


# ---------------------------------------------------------------- generated code


def test_committed_generated_code_matches_a_fresh_generation(tmp_path: Path) -> None:
    protogen.generate(ROOT, tmp_path)
    fresh, committed = protogen.generated_files(tmp_path), protogen.generated_files(ROOT)
    differing = sorted(
        rel.as_posix()
        for rel in set(fresh) | set(committed)
        if not (tmp_path / rel).is_file()
        or not (ROOT / rel).is_file()
        or (tmp_path / rel).read_bytes() != (ROOT / rel).read_bytes()
    )
    assert not differing, f"stale generated files (run `make protos`): {differing}"
    # one module, stub and grpc file per source
    assert len(fresh) == 3 * len(protogen.proto_sources(ROOT))


def test_sources_are_found_where_the_imported_package_lives() -> None:
    package_dir = Path(calculet.v1.__file__).resolve().parent
    assert package_dir == ROOT / protogen.PACKAGE_DIR


@pytest.mark.parametrize("rel", [p for p in protogen.generated_files(ROOT) if p.suffix == ".py"])
def test_every_generated_module_imports_from_the_committed_file(rel: Path) -> None:
    module = importlib.import_module(".".join(rel.with_suffix("").parts))
    assert module.__file__ is not None
    assert Path(module.__file__).resolve() == (ROOT / rel).resolve()


def test_generated_package_imports_from_outside_the_repo(tmp_path: Path) -> None:
    code = (
        "from calculet.v1 import daemon_pb2_grpc\n"
        "assert hasattr(daemon_pb2_grpc, 'DaemonStub')\n"
        "print(daemon_pb2_grpc.__file__)\n"
    )
    # -I: no cwd or PYTHONPATH on sys.path, so only the installed distribution can satisfy the import.
    done = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).resolve() == (ROOT / protogen.PACKAGE_DIR / "daemon_pb2_grpc.py")


# ---------------------------------------------------------------- service shape


def test_service_has_exactly_the_planned_rpcs_and_streaming_shapes() -> None:
    assert {m.name for m in SERVICE.methods} == set(EXPECTED_PLANES)
    for method in SERVICE.methods:
        assert method.client_streaming == (method.name in CLIENT_STREAMING), method.name
        assert method.server_streaming == (method.name in SERVER_STREAMING), method.name
    servicer_methods = {n for n in vars(daemon_pb2_grpc.DaemonServicer) if not n.startswith("_")}
    assert servicer_methods == set(EXPECTED_PLANES)


def test_every_rpc_declares_its_plane() -> None:
    for method in SERVICE.methods:
        options = method.GetOptions()
        assert options.HasExtension(options_pb2.plane), f"{method.name} has no plane option"
        assert options.Extensions[options_pb2.plane] == EXPECTED_PLANES[method.name], method.name


# ---------------------------------------------------------------- conventions


def _undocumented(files: descriptor_pb2.FileDescriptorSet) -> list[str]:
    """Names of every file header, message, field, oneof, enum, value, service, RPC and extension
    that has no comment attached (leading or trailing)."""
    missing: list[str] = []
    for f in files.file:
        comments = {
            tuple(loc.path): (loc.leading_comments + loc.trailing_comments).strip()
            for loc in f.source_code_info.location
        }
        header = [loc for loc in f.source_code_info.location if list(loc.path) == [12]]
        if not any(loc.leading_comments.strip() or loc.leading_detached_comments for loc in header):
            missing.append(f"{f.name}: header")

        def need(path: tuple[int, ...], name: str, _c: dict[tuple[int, ...], str] = comments) -> None:
            if not _c.get(path):
                missing.append(name)

        def enum(path: tuple[int, ...], e: descriptor_pb2.EnumDescriptorProto, prefix: str) -> None:
            need(path, f"{prefix}{e.name}")
            for j, v in enumerate(e.value):
                need((*path, 2, j), f"{prefix}{e.name}.{v.name}")

        def message(path: tuple[int, ...], m: descriptor_pb2.DescriptorProto, prefix: str) -> None:
            name = f"{prefix}{m.name}"
            need(path, name)
            for j, fld in enumerate(m.field):
                need((*path, 2, j), f"{name}.{fld.name}")
            for j, nested in enumerate(m.nested_type):
                if not nested.options.map_entry:
                    message((*path, 3, j), nested, f"{name}.")
            for j, e in enumerate(m.enum_type):
                enum((*path, 4, j), e, f"{name}.")
            for j, oneof in enumerate(m.oneof_decl):
                # proto3 `optional` fields get synthetic oneofs named `_<field>`: not written by hand
                if not oneof.name.startswith("_"):
                    need((*path, 8, j), f"{name}.{oneof.name}")

        for i, m in enumerate(f.message_type):
            message((4, i), m, "")
        for i, e in enumerate(f.enum_type):
            enum((5, i), e, "")
        for i, s in enumerate(f.service):
            need((6, i), s.name)
            for j, rpc in enumerate(s.method):
                need((6, i, 2, j), f"{s.name}.{rpc.name}")
        for i, ext in enumerate(f.extension):
            need((7, i), ext.name)
    return missing


def test_every_element_of_the_protocol_is_documented() -> None:
    files = descriptor_pb2.FileDescriptorSet.FromString(protogen.descriptor_set(ROOT))
    assert {f.name for f in files.file} == {p.as_posix() for p in protogen.proto_sources(ROOT)}
    assert _undocumented(files) == []


def test_documentation_check_catches_a_missing_comment(tmp_path: Path) -> None:
    src = tmp_path / protogen.PACKAGE_DIR
    src.mkdir(parents=True)
    (src / "bare.proto").write_text(
        '// header\nsyntax = "proto3";\npackage calculet.v1;\n'
        "// documented\nmessage M {\n  // documented\n  int32 a = 1;\n  int32 b = 2;\n}\n"
    )
    files = descriptor_pb2.FileDescriptorSet.FromString(protogen.descriptor_set(tmp_path))
    assert _undocumented(files) == ["M.b"]


def _all_enums() -> list[EnumDescriptor]:
    found: list[EnumDescriptor] = []
    for module in MODULES:
        found += module.DESCRIPTOR.enum_types_by_name.values()
        for msg in module.DESCRIPTOR.message_types_by_name.values():
            found += msg.enum_types
    return found


def test_enums_are_prefixed_and_start_with_unspecified_zero() -> None:
    enums = _all_enums()
    assert enums
    for enum in enums:
        prefix = re.sub(r"(?<!^)(?=[A-Z])", "_", enum.name).upper() + "_"
        assert enum.values[0].name == f"{prefix}UNSPECIFIED" and enum.values[0].number == 0, enum.name
        assert all(v.name.startswith(prefix) for v in enum.values), enum.name


def test_error_kind_mirrors_domain_errors_and_numbers_are_grpc_codes() -> None:
    wire = {v.name.removeprefix("ERROR_KIND_"): v.number for v in common_pb2.ErrorKind.DESCRIPTOR.values}
    assert wire.pop("UNSPECIFIED") == grpc.StatusCode.OK.value[0]
    assert set(wire) == {k.name for k in ErrorKind}
    for name, number in wire.items():
        grpc_name = "RESOURCE_EXHAUSTED" if name == "OVERLOADED" else name
        assert number == grpc.StatusCode[grpc_name].value[0], name


def test_model_states_follow_the_design_lifecycle() -> None:
    names = [v.name.removeprefix("MODEL_STATE_") for v in common_pb2.ModelState.DESCRIPTOR.values]
    expected = ["UNLOADED", "VALIDATING", "CONFIGURING", "WARMING", "READY", "DRAINING", "UNLOADING"]
    # QUARANTINED came later (issue 21: repeated non-finite outputs), appended to keep the numbers.
    assert names == ["UNSPECIFIED", *expected, "FAILED", "QUARANTINED"]


PRESENCE_FIELDS = [
    (inference_pb2.SamplingParams, "seed"),
    (inference_pb2.SamplingParams, "temperature"),
    (inference_pb2.SamplingParams, "top_p"),
    (inference_pb2.SamplingParams, "repetition_penalty"),
    (inference_pb2.SamplingParams, "logprobs"),
    (inference_pb2.StoppingParams, "max_tokens"),
    (inference_pb2.SubmitRequest, "deadline_ms"),
    (inference_pb2.Final, "stop_token_id"),
    (operate_pb2.LoadOptions, "lanes"),
    (operate_pb2.UnloadRequest, "drain_timeout_ms"),
    (operate_pb2.DrainRequest, "timeout_ms"),
]


@pytest.mark.parametrize(("cls", "name"), PRESENCE_FIELDS)
def test_fields_whose_zero_differs_from_unset_keep_presence(cls: type, name: str) -> None:
    assert cls.DESCRIPTOR.fields_by_name[name].has_presence
    unset = cls.FromString(cls().SerializeToString())
    assert not unset.HasField(name)
    zero = cls.FromString(cls(**{name: 0}).SerializeToString())
    assert zero.HasField(name)
    assert getattr(zero, name) == 0


# ---------------------------------------------------------------- round trips


@settings(max_examples=50, deadline=None)
@given(
    prompt=st.lists(UINT32, min_size=1, max_size=50),
    resume=st.lists(UINT32, max_size=20),
    seed=st.integers(min_value=0, max_value=2**64 - 1),
    temperature=st.none() | FLOAT32,
    top_k=UINT32,
    max_tokens=st.none() | UINT32,
    priority=st.integers(min_value=-(2**31), max_value=2**31 - 1),
    request_id=st.text(max_size=20),
)
def test_submit_request_round_trips(
    prompt: list[int],
    resume: list[int],
    seed: int,
    temperature: float | None,
    top_k: int,
    max_tokens: int | None,
    priority: int,
    request_id: str,
) -> None:
    sampling = inference_pb2.SamplingParams(seed=seed, top_k=top_k, logprobs=5)
    if temperature is not None:
        sampling.temperature = temperature
    stopping = inference_pb2.StoppingParams(stop_token_ids=[1, 2], ignore_eos=True)
    if max_tokens is not None:
        stopping.max_tokens = max_tokens
    req = inference_pb2.SubmitRequest(
        model="tiny",
        client_request_id=request_id,
        prompt_tokens=prompt,
        resume_tokens=resume,
        sampling=sampling,
        stopping=stopping,
        priority=priority,
    )
    back = inference_pb2.SubmitRequest.FromString(req.SerializeToString())
    assert back == req
    assert list(back.prompt_tokens) == prompt and list(back.resume_tokens) == resume
    assert back.sampling.HasField("temperature") == (temperature is not None)
    assert back.stopping.HasField("max_tokens") == (max_tokens is not None)
    assert not back.HasField("deadline_ms")


def test_token_ids_reject_negative_values() -> None:
    with pytest.raises(ValueError):
        inference_pb2.SubmitRequest(prompt_tokens=[-1])


def test_wait_event_carries_exactly_one_of_tokens_or_final() -> None:
    chunk = inference_pb2.TokenChunk(
        first_index=4,
        tokens=[7, 8],
        logprobs=[
            inference_pb2.TokenLogprob(token=7, logprob=-0.5, top=[inference_pb2.TopLogprob(token=9)]),
            inference_pb2.TokenLogprob(token=8, logprob=-0.25),
        ],
    )
    event = inference_pb2.WaitEvent(index=2, tokens=chunk)
    back = inference_pb2.WaitEvent.FromString(event.SerializeToString())
    assert back.WhichOneof("event") == "tokens" and back == event

    final = inference_pb2.Final(
        finish_reason=inference_pb2.FINISH_REASON_ERROR,
        usage=inference_pb2.Usage(prompt_tokens=3, completion_tokens=6, resumed_tokens=4),
        timings=inference_pb2.Timings(ttft_s=0.25, e2e_s=1.5),
        error=common_pb2.ErrorStatus(kind=common_pb2.ERROR_KIND_UNAVAILABLE, message="draining"),
    )
    event.final.CopyFrom(final)  # setting the other member clears `tokens`
    back = inference_pb2.WaitEvent.FromString(event.SerializeToString())
    assert back.WhichOneof("event") == "final"
    assert not back.HasField("tokens")
    assert back.final == final and back.index == 2


def test_fault_spec_trigger_is_one_of_index_or_probability() -> None:
    spec = operate_pb2.FaultSpec(kind=operate_pb2.FAULT_KIND_CCU_EXCEPTION, job_index=0)
    assert spec.WhichOneof("trigger") == "job_index"  # index 0 is a real trigger, not "unset"
    spec.probability = 0.5
    spec.seed = 11
    back = operate_pb2.FaultSpec.FromString(spec.SerializeToString())
    assert back.WhichOneof("trigger") == "probability" and not back.HasField("job_index")
    assert back == spec
    assert operate_pb2.FaultSpec().WhichOneof("trigger") is None


def test_status_and_load_progress_round_trip() -> None:
    status = observe_pb2.StatusResponse(
        models=[
            observe_pb2.ModelStatus(
                alias="tiny",
                generation=3,
                state=common_pb2.MODEL_STATE_READY,
                lanes=[
                    observe_pb2.LaneStatus(index=0, state=observe_pb2.LANE_STATE_ACTIVE, job_id="j1", kv_length=9),
                    observe_pb2.LaneStatus(index=1, state=observe_pb2.LANE_STATE_UNKNOWN),
                ],
                queues=observe_pb2.QueueDepths(decode_ready=1, long_prefill=2),
            )
        ],
        jobs=[observe_pb2.JobSummary(job_id="j1", state=observe_pb2.JOB_STATE_DECODE, lane=0)],
        resets=observe_pb2.ResetSummary(count=1, last_kind=common_pb2.RESET_KIND_CCU),
    )
    back = observe_pb2.StatusResponse.FromString(status.SerializeToString())
    assert back == status
    assert back.jobs[0].HasField("lane")  # lane 0 is held, not "no lane"

    progress = operate_pb2.LoadProgress(
        state=common_pb2.MODEL_STATE_FAILED,
        done=True,
        error=common_pb2.ErrorStatus(kind=common_pb2.ERROR_KIND_FAILED_PRECONDITION, message="hash mismatch"),
    )
    assert operate_pb2.LoadProgress.FromString(progress.SerializeToString()) == progress


# ---------------------------------------------------------------- the generator


def test_find_proto_root_refuses_a_tree_without_sources(tmp_path: Path) -> None:
    with pytest.raises(ProtoGenError, match=re.escape(str(tmp_path))) as info:
        protogen.find_proto_root(tmp_path)
    assert info.value.kind is ErrorKind.FAILED_PRECONDITION


def test_main_reports_missing_sources_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert protogen.main(["--protos", str(tmp_path / "nowhere")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("protogen: ") and err.count("\n") == 1


def test_protoc_errors_are_typed(tmp_path: Path) -> None:
    src = tmp_path / protogen.PACKAGE_DIR
    src.mkdir(parents=True)
    (src / "broken.proto").write_text('syntax = "proto3";\nmessage {\n')
    with pytest.raises(ProtoGenError, match="protoc failed"):
        protogen.generate(tmp_path, tmp_path / "out")
    assert protogen.generated_files(tmp_path / "out") == []


def test_generate_writes_only_changes_and_removes_stale_files(tmp_path: Path) -> None:
    src = tmp_path / "src" / protogen.PACKAGE_DIR
    src.mkdir(parents=True)
    (src / "tiny.proto").write_text(
        'syntax = "proto3";\npackage calculet.v1;\nmessage Ping { int32 n = 1; }\n'
        "service Echo { rpc Call(Ping) returns (Ping); }\n"
    )
    out = tmp_path / "out"
    (out / protogen.PACKAGE_DIR).mkdir(parents=True)
    stale = out / protogen.PACKAGE_DIR / "gone_pb2.py"
    stale.write_text("# from a deleted proto\n")
    keep = out / protogen.PACKAGE_DIR / "__init__.py"
    keep.write_text('"""not generated."""\n')
    expected = [protogen.PACKAGE_DIR / n for n in ("tiny_pb2.py", "tiny_pb2.pyi", "tiny_pb2_grpc.py")]

    first = protogen.generate(tmp_path / "src", out)
    assert sorted(first.written) == expected
    assert first.removed == [protogen.PACKAGE_DIR / "gone_pb2.py"]
    assert not stale.exists() and keep.exists()
    assert protogen.generated_files(out) == expected

    mtimes = {rel: (out / rel).stat().st_mtime_ns for rel in expected}
    second = protogen.generate(tmp_path / "src", out)
    assert second.written == [] and second.removed == []
    assert sorted(second.unchanged) == expected
    assert {rel: (out / rel).stat().st_mtime_ns for rel in expected} == mtimes
