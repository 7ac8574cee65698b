"""Egress for sandboxes that have none of their own: a policy of allowed destinations decided
after name resolution (`policy`), and the HTTP proxy that applies it and adds the tenant's
credentials (`proxy`), at each sandbox's bandwidth (`rate`)."""

from sandboxes.server.egress.policy import Decision, EgressPolicy, Rule, decide, parse_rule
from sandboxes.server.egress.proxy import Credential, EgressContext, EgressProxy
from sandboxes.server.egress.rate import ByteRate

__all__ = [
    "ByteRate",
    "Credential",
    "Decision",
    "EgressContext",
    "EgressPolicy",
    "EgressProxy",
    "Rule",
    "decide",
    "parse_rule",
]
