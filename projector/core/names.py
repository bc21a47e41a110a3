"""The API server's name rules: DNS labels and subdomains, qualified names, label values, keys.

Re-checked where projector relies on them (a grant's spec), as the CRD's schema states them.
"""

from __future__ import annotations

import re

FIELD_MANAGER = "projector"
"""The field manager of every write (`projector.client.api`), and part of a copy's ownership proof
(`projector.core.model`)."""

_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]{1,253}")
_QUALIFIED_NAME = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?")


def is_label(value: object) -> bool:
    """A DNS-1123 label: what the API server accepts as a namespace name."""
    return isinstance(value, str) and _DNS1123_LABEL.fullmatch(value) is not None


def is_subdomain(value: object) -> bool:
    """A DNS-1123 subdomain: what the API server accepts as an object name."""
    return (
        isinstance(value, str)
        and len(value) <= 253
        and _DNS1123_SUBDOMAIN.fullmatch(value) is not None
    )


def is_secret_key(value: object) -> bool:
    """A key of a Secret's data as the API server accepts it."""
    return (
        isinstance(value, str)
        and value != "."
        and not value.startswith("..")  # the API server reserves these (IsConfigMapKey)
        and _SECRET_KEY.fullmatch(value) is not None
    )


def is_qualified_name(value: object) -> bool:
    """A label or annotation key as the API server accepts it (the CRD's rule, re-checked)."""
    return (
        isinstance(value, str)
        and _QUALIFIED_NAME.fullmatch(value) is not None
        and len(value.split("/")[0]) <= 253
    )


def is_label_value(value: object) -> bool:
    """A label value as the API server accepts it: at most 63 characters, may be empty."""
    return isinstance(value, str) and _LABEL_VALUE.fullmatch(value) is not None
