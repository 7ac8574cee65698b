"""The network a sandbox made from a snapshot starts with: what the snapshot recorded of its
sandbox at its taking (`KeptNetwork`: its egress allow-list, the headers its egress proxy adds,
E2B's ``allowPublicTraffic`` and ``maskRequestHost``, the ports made public through ``PUT
.../ports/{port}``), save what the create names of its own.
A fork is a snapshot restored at once, so a fork starts with its parent's network as it was at
the fork, narrowed or opened since its create; never its template's defaults instead.

On a template without egress a sandbox reaches nothing whatever its list: the snapshot's list and
headers are not taken there (nothing would serve them), its ports' settings are."""

from __future__ import annotations

from sandboxes.api import CreateSandbox
from sandboxes.server.snapshots import KeptNetwork
from sandboxes.server.store import SandboxState
from sandboxes.templates import TemplateConfig

__all__ = ["kept_network", "take_kept", "with_kept_egress"]


def kept_network(state: SandboxState) -> KeptNetwork:
    """The sandbox's network now, as a snapshot of it records it."""
    return KeptNetwork(
        egress_allow=None if state.egress_allow is None else list(state.egress_allow),
        egress_headers={host: dict(values) for host, values in state.egress_headers.items()},
        public_ports=state.public_ports,
        mask_request_host=state.mask_request_host,
        preview_public=list(state.preview_public),
    )


def with_kept_egress(request: CreateSandbox, kept: KeptNetwork | None, template: TemplateConfig) -> CreateSandbox:
    """``request`` with the snapshot's allow-list if it names none of its own and its template
    has egress; itself otherwise."""
    if kept is None or kept.egress_allow is None or request.egress_allow is not None or not template.egress:
        return request
    return request.model_copy(update={"egress_allow": list(kept.egress_allow)})


def take_kept(state: SandboxState, kept: KeptNetwork | None, template: TemplateConfig) -> bool:
    """The snapshot's headers (on a template with egress) and ports' settings in ``state``, a
    sandbox just made from it (its allow-list is its create's, `with_kept_egress`); whether it
    now has a network of its own, to record as one set through the API (`SandboxState.network_set`:
    a shared backend's record may not hold all of it)."""
    if kept is None:
        return False
    headers = kept.egress_headers if template.egress else {}
    state.egress_headers = {host: dict(values) for host, values in headers.items()}
    state.public_ports, state.mask_request_host = kept.public_ports, kept.mask_request_host
    state.preview_public = list(kept.preview_public)
    own = (state.egress_allow, state.public_ports, state.mask_request_host)
    return bool(state.egress_headers or state.preview_public) or any(setting is not None for setting in own)
