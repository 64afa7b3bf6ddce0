"""The modelled cost of configuring a package on a calsim board (what a model switch pays).

Owns the arithmetic only; `CalsimDevice.configure` paces itself by the total (scaled by
`time_scale`) and hands the breakdown to the caller on the configured model, which the daemon
reports and audits as the switch's Configuring phase. docs/sources.md 000 §9.3: on CalRT 0.7.6 a
switch is a drained unload, then configure, parameter upload, program deployment and KV clearing.

    configure  = CONFIGURE_FIXED_S                                   (runtime, calbin parse, CSRs)
    upload     = params bytes (DRAM + SRAM, every chip) / timing.h2d_gbps
    deploy     = DEPLOY_PER_SUBMODEL_S x submodels                   (command streams, ELFs)
    kv_clear   = max over chips (KV bytes on the chip) / KV_CLEAR_GBPS  (chips clear in parallel)

Every constant is an ASSUMPTION (no switch has been measured on a board); the upload uses the
package's own declared H2D rate, as job copies do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

from calculet.daemon.calsim.memory import ChipNeed
from calculet.daemon.package.manifest import PackageManifest

CONFIGURE_FIXED_S = 0.2  # ASSUMPTION: runtime configure of a calbin, before any bulk copy
DEPLOY_PER_SUBMODEL_S = 0.05  # ASSUMPTION: loading one submodel's command stream and ELFs
KV_CLEAR_GBPS = 50.0  # ASSUMPTION: a device memset near one chip's measured ~53 GB/s of weight reads

PHASES = ("configure", "upload", "deploy", "kv_clear")


def configure_cost(manifest: PackageManifest, needs: Sequence[ChipNeed]) -> Mapping[str, float]:
    """Modelled seconds of each phase of configuring `manifest` with memory `needs`, in `PHASES` order."""
    params = sum(n.param_dram + n.sram for n in needs)
    kv = max((n.kv for n in needs), default=0)
    return MappingProxyType(
        {
            "configure": CONFIGURE_FIXED_S,
            "upload": params / (manifest.timing.h2d_gbps * 1e9),
            "deploy": DEPLOY_PER_SUBMODEL_S * len(manifest.submodels),
            "kv_clear": kv / (KV_CLEAR_GBPS * 1e9),
        }
    )
