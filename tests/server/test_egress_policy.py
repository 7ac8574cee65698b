"""The egress policy decides on resolved addresses, and refuses every non-public range unless an
operator opened it: checked on the decision function alone, so no packet goes anywhere."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandboxes.api import EGRESS_RULE
from sandboxes.server.egress import EgressPolicy, decide, parse_rule

PUBLIC = "93.184.215.14"


def test_a_named_host_is_allowed_on_its_ports_only() -> None:
    policy = EgressPolicy(allow=["example.com:443,80"])
    assert decide(policy, "example.com", 443, [PUBLIC]).allowed
    assert decide(policy, "EXAMPLE.com.", 80, [PUBLIC]).allowed
    refused = decide(policy, "example.com", 22, [PUBLIC])
    assert not refused.allowed
    assert "port 22" in refused.reason
    assert not decide(policy, "other.com", 443, [PUBLIC]).allowed


def test_wildcards_cover_subdomains_not_the_apex_nor_lookalikes() -> None:
    policy = EgressPolicy(allow=["*.pypi.org"])
    assert decide(policy, "files.pypi.org", 443, [PUBLIC]).allowed
    assert not decide(policy, "pypi.org", 443, [PUBLIC]).allowed
    assert not decide(policy, "evilpypi.org", 443, [PUBLIC]).allowed


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",  # the cloud metadata address
        "100.64.0.1",
        "0.0.0.0",
        "224.0.0.1",
        "::1",
        "fd00::1",
        "fe80::1",
        "::ffff:169.254.169.254",  # IPv4-mapped: unwrapped before the check
    ],
)
def test_non_public_addresses_are_refused_even_for_an_allowed_name(address: str) -> None:
    decision = decide(EgressPolicy(allow=["*"]), "innocent.example", 80, [address])
    assert not decision.allowed
    assert "non-public" in decision.reason


def test_a_name_rebound_to_a_private_address_is_refused_and_the_checked_address_is_used() -> None:
    policy = EgressPolicy(allow=["api.example.com"])
    assert not decide(policy, "api.example.com", 443, ["10.0.0.5"]).allowed
    mixed = decide(policy, "api.example.com", 443, ["10.0.0.5", PUBLIC])
    assert mixed.allowed
    assert str(mixed.address) == PUBLIC


def test_an_operator_opens_a_range_to_rules_only() -> None:
    opened = EgressPolicy(allow=["127.0.0.2:8080"], open_ranges=["127.0.0.0/8"])
    assert decide(opened, "127.0.0.2", 8080, ["127.0.0.2"]).allowed
    assert not decide(opened, "127.0.0.3", 8080, ["127.0.0.3"]).allowed  # opened, but no rule
    assert not decide(opened, "127.0.0.2", 8081, ["127.0.0.2"]).allowed


def test_networks_and_bad_rules() -> None:
    policy = EgressPolicy(allow=["93.184.0.0/16:443", "[2606:2800::/32]:443"])
    assert decide(policy, "whatever.example", 443, [PUBLIC]).allowed
    assert parse_rule("[2606:2800::/32]:443").network is not None
    for bad in ["", "exa mple.com", "host:99999", "[::1", "a:b:c"]:
        with pytest.raises(ValueError):
            parse_rule(bad)
    with pytest.raises(ValueError):
        EgressPolicy(allow=["not a host"])


@settings(max_examples=400, deadline=None)
@given(st.from_regex(EGRESS_RULE, fullmatch=True).filter(lambda text: len(text) <= 300))
def test_every_rule_the_schema_admits_the_parser_takes(text: str) -> None:
    """The OpenAPI pattern of a rule (`sandboxes.api.EGRESS_RULE`) admits nothing the parser
    refuses: a schema-valid create or ``PUT .../egress`` is never answered 422 for its rules."""
    parse_rule(text)


@pytest.mark.parametrize(
    "text", ["example.com", "*.example.com", "*", "10.0.0.0/8", "example.com:443,80", "[fd00::/8]:443", "::1"]
)
def test_the_documented_rules_match_the_schema(text: str) -> None:
    assert re.fullmatch(EGRESS_RULE.removeprefix("^").removesuffix("$"), text)


@pytest.mark.parametrize("text", ["\U000d2523[", "a..b", "example.com:0", "10.0.0.0/33", "[::1", "fd00::/8:443"])
def test_rules_the_parser_refuses_are_outside_the_schema(text: str) -> None:
    assert re.fullmatch(EGRESS_RULE.removeprefix("^").removesuffix("$"), text) is None
    with pytest.raises(ValueError):
        parse_rule(text)
