"""``GET /e2b/sandboxes/{id}/metrics``: the samples the service keeps of a sandbox's usage
(`sandboxes.server.usage`) in E2B's shape (``SandboxMetric``), between ``start`` and ``end``
(Unix seconds, both optional). E2B's fields are integers that cannot be null: a value the
sample does not know is answered 0; ``cpuUsedPct`` is of the sandbox's ``cpuCount`` (the
template's CPUs, as its sandbox detail says), where the service's own is of one CPU. A sandbox
asked for its metrics before it has any gets its exec helper started, as E2B's are sampled from
their start: the service's sampler then samples it from its next round on."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import JSONResponse

from sandboxes import api
from sandboxes._mux import HoldsHelper
from sandboxes.server.e2b.common import PREFIX, E2BRoute, service
from sandboxes.server.e2b.control import _tenant
from sandboxes.server.usage import Sampler

__all__ = ["router"]

router = APIRouter(prefix=PREFIX, route_class=E2BRoute, include_in_schema=False)


@router.get("/sandboxes/{sandbox_id}/metrics")
async def sandbox_metrics(
    request: Request,
    sandbox_id: str,
    api_key: Annotated[str | None, Header(alias="X-API-KEY")] = None,
    start: Annotated[int | None, Query(ge=0)] = None,
    end: Annotated[int | None, Query(ge=0)] = None,
) -> Response:
    entry = await service(request).registry.find(_tenant(request, api_key), sandbox_id)
    sampler: Sampler = request.app.state.usage
    cpus = max(1, round(float(getattr(entry.backend.template, "cpus", 1) or 1)))
    kept = sampler.samples(entry.state.id).samples
    if not kept and isinstance(entry.sandbox, HoldsHelper):
        await asyncio.to_thread(entry.sandbox.exec_helper)
    wanted = [s for s in kept if (start is None or s.timestamp >= start) and (end is None or s.timestamp <= end)]
    return JSONResponse([_metric(sample, cpus) for sample in wanted])


def _metric(sample: api.MetricsSample, cpus: int) -> dict[str, object]:
    return {
        "timestamp": datetime.fromtimestamp(sample.timestamp, UTC).isoformat().replace("+00:00", "Z"),
        "timestampUnix": int(sample.timestamp),
        "cpuCount": cpus,
        "cpuUsedPct": 0.0 if sample.cpu_percent is None else round(sample.cpu_percent / cpus, 2),
        "memUsed": sample.memory_used or 0,
        "memTotal": sample.memory_limit or 0,
        "memCache": 0,
        "diskUsed": sample.disk_used or 0,
        "diskTotal": sample.disk_total or 0,
    }
