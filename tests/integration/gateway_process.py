"""`GatewayProcess`: the real `calculet-gateway` process under test, on a Unix socket in a temp dir.

It polls `GET /health` (then `/ready` when asked) through an httpx Unix-socket transport, fails
fast with the gateway's log if the process dies, and stops it with SIGTERM. `http()` and
`openai()` give clients bound to the socket (the official `openai` package over an httpx client).
`Oracle` computes what the gateway must answer without it: the package's own tokenizer and
template (from GetModel), tokens generated directly on a daemon with the same seed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from calculet.client import Constraint, DaemonClient, SamplingParams, ThinkingBudget
from calculet.gateway.api.thinking import free_thinking
from calculet.gateway.api.tool_grammar import call_tags, tool_call_constraint
from calculet.gateway.api.tool_schemas import Tool

STARTUP_TIMEOUT_S = 60.0
BASE_URL = "http://gateway"


def terminate(proc: subprocess.Popen[bytes], grace_s: float = 30.0) -> int:
    """SIGTERM, wait up to `grace_s`, then SIGKILL; the exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def plain_uds_transport(socket: Path) -> httpx.HTTPTransport:
    """A transport for plain HTTP over the Unix socket `socket`. verify=False: there is no TLS to
    verify, and the default context loads the CA store, 27 ms of CPU per client, paid by every
    poll of /ready while the CPU is what the suite is short of."""
    return httpx.HTTPTransport(uds=str(socket), verify=False)


class GatewayProcess:
    """The gateway process (see the module docstring)."""

    def __init__(self, workdir: Path, args: list[str]) -> None:
        self.workdir = workdir
        self.socket = workdir / "gateway.sock"
        self.log_path = workdir / "gateway.log"
        cmd = [sys.executable, "-m", "calculet.gateway.main", "--listen", f"unix:{self.socket}", *args]
        self._log = self.log_path.open("wb")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=workdir, env=env)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def http(self, timeout: float = 60.0) -> httpx.Client:
        return httpx.Client(transport=plain_uds_transport(self.socket), base_url=BASE_URL, timeout=timeout)

    def openai(self, timeout: float = 60.0) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{BASE_URL}/v1", api_key="unused", http_client=self.http(timeout), max_retries=0)

    def ready(self) -> dict[str, Any]:
        with self.http(5) as client:
            return client.get("/ready").json()  # type: ignore[no-any-return]

    def wait_until(self, condition: Callable[[dict[str, Any]], bool], what: str, timeout: float = 30.0) -> None:
        """Poll /ready until `condition(body)` holds; fail with the log at the deadline or on exit."""
        deadline = time.monotonic() + timeout
        body: dict[str, Any] = {}
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"gateway exited with {self.proc.returncode}:\n{self.log()}")
            try:
                body = self.ready()
                if condition(body):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        pytest.fail(f"gateway: {what} not reached in {timeout}s (last /ready {body}):\n{self.log()}")

    def wait_up(self, ready: bool) -> None:
        if ready:
            self.wait_until(lambda body: body.get("status") == "ready", "ready", STARTUP_TIMEOUT_S)
        else:
            self.wait_until(lambda body: "status" in body, "serving HTTP", STARTUP_TIMEOUT_S)

    def stop(self) -> int:
        code = terminate(self.proc)
        self._log.close()
        return code


class Oracle:
    """Expected prompt tokens and texts, computed beside the gateway."""

    def __init__(self, daemon_target: str, alias: str) -> None:
        self.client = DaemonClient(daemon_target)
        self.alias = alias
        info = self.client.get_model(alias)
        self.tokenizer = Tokenizer.from_str(info.tokenizer_json.decode())
        self.template = ImmutableSandboxedEnvironment().from_string(info.chat_template)
        self.eos = set(info.eos_token_ids)

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        text = self.template.render(messages=messages, add_generation_prompt=True)
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def tokens(
        self,
        prompt: list[int],
        seed: int,
        max_tokens: int,
        temperature: float = 1.0,
        ignore_eos: bool = False,
        constraint: Constraint | None = None,
        thinking: ThinkingBudget | None = None,
        resume: list[int] | None = None,
    ) -> list[int]:
        """The tokens of an undisturbed run (`constraint` / `thinking`: as the gateway sends them;
        `resume`: tokens the answer already has, which the result does not repeat)."""
        sampling = SamplingParams(seed=seed, temperature=temperature, constraint=constraint, thinking=thinking)
        gen = self.client.generate(
            self.alias, prompt, max_tokens=max_tokens, ignore_eos=ignore_eos, sampling=sampling,
            resume_tokens=resume or (),
        )  # fmt: skip
        return gen.result()

    def auto_tools(self, tools: list[dict[str, Any]], parallel: bool = True, thinking: bool = True) -> dict[str, Any]:
        """The `constraint` and `thinking` of `tokens` the gateway sends with chat `tools` under
        `tool_choice: auto`: the lazy call grammar, and the unbounded budget that lets it think first
        (none with `enable_thinking: false`)."""
        checked = [Tool.model_validate(t) for t in tools]
        constraint = tool_call_constraint(checked, "auto", parallel, call_tags(self.tokenizer.token_to_id))
        budget = free_thinking(self.tokenizer.token_to_id, ()) if thinking else None
        return {"constraint": constraint, "thinking": budget}

    def text(self, tokens: list[int]) -> str:
        visible = [t for t in tokens if t not in self.eos and t < self.tokenizer.get_vocab_size()]
        return self.tokenizer.decode(visible, skip_special_tokens=True)
