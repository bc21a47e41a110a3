"""The transport's pure checks (its behaviour on the wire is tested on the real API server)."""

from __future__ import annotations

from typing import Any

import pytest

from projector import kube
from projector.api import SECRETS
from projector.errors import ServerError


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({}, id="empty"),
        pytest.param({"metadata": {}}, id="no-metadata"),
        pytest.param({"metadata": {"name": "s"}}, id="no-uid"),
    ],
)
def test_a_read_that_succeeds_with_nothing_in_it_is_an_error(body: dict[str, Any]) -> None:
    """A 200 without the object's name and uid is never taken as "not exported" (seed outage)."""
    with pytest.raises(ServerError) as err:
        kube._whole(body, SECRETS)
    assert err.value.transient


def test_a_read_with_name_and_uid_is_the_object() -> None:
    body = {"metadata": {"name": "s", "uid": "u"}}
    assert kube._whole(body, SECRETS) is body
