"""The transport's pure checks (its behaviour on the wire is tested on the real API server)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from projector.client import api, kube
from projector.core.kinds import SECRETS
from projector.errors import ServerError
from tests.bed.controlplane.plane import free_port
from tests.support import python_runs


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
        api.whole(body, SECRETS)
    assert err.value.transient


def test_a_read_with_name_and_uid_is_the_object() -> None:
    body = {"metadata": {"name": "s", "uid": "u"}}
    assert api.whole(body, SECRETS) is body


async def test_a_transport_failure_keeps_its_cause() -> None:
    """Nothing listens on the port: the error says so, and chains the transport's own."""
    auth = SimpleNamespace(server=f"https://127.0.0.1:{free_port()}", token=None)
    client = kube.Kube(auth, None, timeout=5)
    try:
        with pytest.raises(ServerError) as err:
            await client.get(SECRETS, "x", namespace="default")
    finally:
        await client.close()
    assert err.value.status == 0 and err.value.transient
    assert isinstance(err.value.__cause__, ConnectionRefusedError)


def test_kr8s_credentials_load_without_the_rest_of_kr8s() -> None:
    """The controller gets kr8s's KubeAuth, not its package (httpx, rich: 15 MiB of RSS), and a
    later `import kr8s` still loads the whole real package."""
    code = (
        "import sys; import projector.client.kube as k; "
        "assert 'httpx' not in sys.modules and 'kr8s' not in sys.modules, sorted(sys.modules); "
        "import kr8s, kr8s._auth; "
        "assert kr8s.__version__ and hasattr(kr8s, 'objects'); "
        "assert k.KubeAuth.__name__ == 'KubeAuth'"
    )
    python_runs(code)
