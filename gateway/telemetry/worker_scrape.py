"""`WorkerScrape`: `GET /metrics` on any worker of a `--workers N` gateway answers for the whole gateway.

The worker the scrape reached renders its own metrics and fetches each sibling's own
(`GET /metrics?scope=worker`, which answers with that worker's metrics alone) over the sibling's
private Unix socket (`workers.identity`), all at once, each within `timeout_s`; then
`metrics_merge` labels every sample with its worker. A sibling that does not answer in time
(restarting, stuck) is left out of that scrape and shows as `calculet_gateway_worker_up{worker="I"} 0`.
Each sibling's fetch is an HTTP request there, counted under `route="/metrics"` like any other.
"""

from __future__ import annotations

import asyncio
import logging

from calculet.gateway.telemetry.metrics_merge import merge_expositions
from calculet.gateway.workers.identity import WorkerIdentity

log = logging.getLogger("calculet.gateway.metrics")

SCOPE_PARAM = "scope"
WORKER_SCOPE = "worker"  # `GET /metrics?scope=worker`: this worker's metrics only, unlabelled
SCRAPE_TIMEOUT_S = 3.0  # per sibling; Prometheus's default scrape timeout is 10 s


class WorkerScrape:
    """Gathers the siblings' metrics for a scrape of `worker`.

    Args:
        worker: this worker.
        timeout_s: how long one sibling may take to answer.
    """

    def __init__(self, worker: WorkerIdentity, timeout_s: float = SCRAPE_TIMEOUT_S) -> None:
        self.worker = worker
        self.timeout_s = timeout_s
        # httpx logs every request at INFO: one line per sibling per scrape would flood the journal.
        logging.getLogger("httpx").setLevel(logging.WARNING)

    async def merged(self, own: bytes) -> bytes:
        """Every worker's metrics, labelled by worker, given this worker's own text `own`."""
        siblings = self.worker.siblings
        texts = await asyncio.gather(*(self._fetch(i) for i in siblings))
        found = dict(zip(siblings, texts, strict=True)) | {self.worker.index: own.decode("utf-8")}
        return merge_expositions([(str(i), found[i]) for i in range(self.worker.count)])

    async def _fetch(self, index: int) -> str | None:
        """Worker `index`'s own metrics, or None if it did not answer them in time."""
        # Imported here: httpx pulls in its command-line extras (rich, click, pygments), a cost every
        # gateway start would pay while only a multi-worker gateway's scrape uses it.
        import httpx

        transport = httpx.AsyncHTTPTransport(uds=str(self.worker.socket_of(index)))
        try:
            async with (
                asyncio.timeout(self.timeout_s),
                httpx.AsyncClient(transport=transport, timeout=self.timeout_s) as client,
            ):
                response = await client.get("http://worker/metrics", params={SCOPE_PARAM: WORKER_SCOPE})
                response.raise_for_status()
                return response.text
        except (httpx.HTTPError, TimeoutError) as err:
            log.warning("metrics of worker %d: %s", index, str(err) or type(err).__name__)
            return None
