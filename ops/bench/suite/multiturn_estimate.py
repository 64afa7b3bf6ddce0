"""Before a comparison fleet starts: its modelled device time, its peak token rate and its longest
device job, from the timing model (for `--list`, the job timeout and the automatic time scale).

Per board, `ceil(users / boards)` conversations; each turn k has about `p_k` prompt tokens
(`MultiturnSizes.prompt_tokens`: the system prompt, k user messages, k - 1 answers, the template's
few tokens a message) and `A` answer tokens. Reuse off: every turn prefills its whole prompt; reuse
on: turn 1 does, turn k >= 2 prefills only what turn k-1 did not leave in its lane (`p_k - p_{k-1} - A`, after
`p_{k-1} + A` KV entries). The decode steps of a turn (`A - 1`, `limit.decode_sum_ms`) are shared by
the `rows` conversations a board decodes together (`min(users per board, lanes, largest batch)`).
Nothing overlaps (a conservative sum); the think time adds wall time only:
`wall = modelled x time scale + (turns - 1) x mean think`. Pure functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from calculet.daemon.calsim.timing import copy_s, prefill_ms
from calculet.ops.bench.device_model import DeviceModel
from calculet.ops.bench.limit import decode_sum_ms
from calculet.ops.bench.suite.multiturn import ComparisonFleet, MultiturnSizes


@dataclass(frozen=True)
class ComparisonEstimate:
    """A comparison fleet's modelled figures (seconds on the device clock unless said).

    Attributes:
        fleet: the fleet.
        users: its conversations.
        modelled_s: device seconds a board needs for its conversations.
        longest_job_s: the longest prefill job (the last turn's, without reuse).
        fleet_tokens_per_s: output tokens per modelled second of the whole fleet.
        think_s: wall seconds each conversation spends thinking (turns - 1 mean think times).
    """

    fleet: ComparisonFleet
    users: int
    modelled_s: float
    longest_job_s: float
    fleet_tokens_per_s: float
    think_s: float

    def wall_s(self, time_scale: float) -> float:
        return self.modelled_s * time_scale + self.think_s


def _prefill_s(model: DeviceModel, n: int, past: int) -> float:
    t = model.timing
    copies = copy_s(n * model.prefill_h2d_per_token, t.h2d_gbps) + copy_s(model.prefill_d2h_per_row, t.d2h_gbps)
    return copies + prefill_ms(t, n, past) / 1000.0


def estimate(fleet: ComparisonFleet, sizes: MultiturnSizes, model: DeviceModel, users: int) -> ComparisonEstimate:
    """The fleet's estimate (module docstring)."""
    per_board = math.ceil(users / fleet.boards)
    rows = min(per_board, model.lanes, model.max_batch)
    batch = model.batch_for(rows)
    t, answer = model.timing, sizes.answer_tokens
    step_copies = copy_s(rows * model.decode_h2d_per_row, t.h2d_gbps) + copy_s(
        rows * model.decode_d2h_per_row, t.d2h_gbps
    )
    conversation = 0.0
    for k in range(1, sizes.turns + 1):
        p = sizes.prompt_tokens(k)
        past = sizes.prompt_tokens(k - 1) + answer if fleet.reuse and k > 1 else 0
        conversation += _prefill_s(model, p - past, past)
        conversation += (decode_sum_ms(t, batch, p, answer - 1) / 1000.0 + (answer - 1) * step_copies) / rows
    device = per_board * conversation
    tokens = fleet.boards * per_board * sizes.turns * answer
    longest = _prefill_s(model, sizes.prompt_tokens(sizes.turns), 0)
    think = (sizes.turns - 1) * (sizes.think.low + sizes.think.high) / 2
    return ComparisonEstimate(fleet, users, device, longest, tokens / device, think)
