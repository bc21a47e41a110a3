"""The test harness itself: waiting, naming and certificates behave as the other tests assume."""

from __future__ import annotations

import re

import pytest
from cryptography import x509
from hypothesis import given
from hypothesis import strategies as st

from tests.bed.controlplane.plane import TinyCA
from tests.bed.kube import eventually, unique_name

DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def test_eventually_returns_first_truthy_value() -> None:
    answers = iter([None, 0, "", "done"])
    assert eventually(lambda: next(answers), timeout=5, interval=0) == "done"


def test_eventually_retries_exceptions() -> None:
    calls: list[int | Exception] = [KeyError("not yet"), AssertionError("nope"), 42]

    def condition() -> int:
        value = calls.pop(0)
        if isinstance(value, Exception):
            raise value
        return value

    assert eventually(condition, timeout=5, interval=0) == 42


def test_eventually_reports_message_and_last_exception() -> None:
    def condition() -> bool:
        raise ValueError("still 404")

    with pytest.raises(AssertionError, match=r"widget missing .*ValueError\('still 404'\)"):
        eventually(condition, timeout=0.05, interval=0.01, message="widget missing")


def test_eventually_reports_last_falsy_value() -> None:
    with pytest.raises(AssertionError, match=r"last value: \[\]"):
        eventually(list, timeout=0.05, interval=0.01)


@given(st.text(max_size=200))
def test_unique_name_is_a_dns_label(base: str) -> None:
    name = unique_name(base)
    assert len(name) <= 63
    assert DNS_LABEL.match(name), name


def test_unique_name_keeps_the_test_name_and_differs() -> None:
    first, second = unique_name("test_watch_sees[param-1]"), unique_name("test_watch_sees[param-1]")
    assert first.startswith("watch-sees-param-1-")
    assert first != second


def test_tiny_ca_issues_verifiable_client_cert() -> None:
    ca = TinyCA("test-ca")
    pair = ca.issue("admin", organizations=["system:masters"], client=True)
    cert = x509.load_pem_x509_certificate(pair.cert_pem)
    cert.verify_directly_issued_by(ca.cert)
    orgs = cert.subject.get_attributes_for_oid(x509.oid.NameOID.ORGANIZATION_NAME)
    assert [o.value for o in orgs] == ["system:masters"]
