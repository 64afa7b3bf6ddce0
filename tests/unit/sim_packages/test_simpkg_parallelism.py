"""`build-sim --parallelism`: the traffic each form declares is its derivation from Qwen3-30B-A3B's
geometry (ops/sim_packages/parallelism.py), the topology keeps its chips and masks, and the forms
calsim cannot model (pp) or that need several chips are refused."""

from __future__ import annotations

import pytest

from calculet.common.errors import InvalidArgument
from calculet.daemon.package.manifest import D2DDecl, Topology
from calculet.ops.sim_packages.parallelism import TRAFFIC, with_parallelism

TWO = Topology(2, (1, 2), "tp")


def test_each_form_declares_its_derived_traffic() -> None:
    layer = 2048 * 2  # one token's BF16 activations at one layer
    traffic = dict(TRAFFIC)
    assert traffic == {
        "tp": (48 * 2 * layer, 146),  # two reduces a layer; today's sync op count
        "ep": (48 * 2 * 4 * layer, 96),  # dispatch + combine of the 4 remote experts of 8; two all-to-alls
        "tp+ep": (48 * 9 * layer, 144),  # one reduce and two all-to-alls a layer
    }
    ep = with_parallelism(TWO, "ep")
    assert (ep.chips, ep.chip_masks, ep.parallelism, ep.d2d) == (2, (1, 2), "ep", D2DDecl(1_572_864, 96))


@pytest.mark.parametrize(
    ("topology", "form", "message"),
    [(TWO, "pp", "pp: stages not modelled"), (Topology(1, (1,), "none"), "tp", "needs several chips")],
)
def test_refused(topology: Topology, form: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        with_parallelism(topology, form)
