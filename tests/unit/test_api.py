"""`Api`'s request shaping: the requests each call hands its transport, as the server sees them."""

from __future__ import annotations

from collections.abc import AsyncGenerator

import pytest

from projector.client.api import (
    APPLY_PATCH,
    JSON,
    MERGE_PATCH,
    METADATA_LIST,
    METADATA_ONLY,
    Api,
    Precondition,
    Request,
    collect,
)
from projector.core.kinds import SECRETS, Obj
from projector.errors import ServerError


class Recorder(Api):
    """Keeps every request; answers each with the next of `answers` (else an object)."""

    def __init__(self, *answers: Obj) -> None:
        self.sent: list[Request] = []
        self.answers = list(answers)

    async def send(self, req: Request) -> Obj:
        self.sent.append(req)
        return self.answers.pop(0) if self.answers else {"metadata": {"name": "s", "uid": "u"}}

    async def stream(
        self, req: Request, read_deadline: float
    ) -> AsyncGenerator[tuple[str, Obj], None]:
        self.sent.append(req)
        yield "OPEN", {}


def page(cont: str = "") -> Obj:
    return {"kind": "SecretList", "metadata": {"resourceVersion": "7", "continue": cont}}


@pytest.mark.parametrize("selector", [None, "a=b"])
async def test_each_page_of_a_list_asks_for_the_next_with_one_continue_token(
    selector: str | None,
) -> None:
    api = Recorder(page("c1"), page("c2"), page())
    pages = api.pages(SECRETS, namespace="ns", label_selector=selector, metadata_only=True, limit=2)
    assert await collect(pages) == ([], "7")
    first = (("limit", "2"),) + ((("labelSelector", selector),) if selector else ())
    assert [r.query for r in api.sent] == [
        first,
        (*first, ("continue", "c1")),
        (*first, ("continue", "c2")),
    ]
    assert {(r.verb, r.method, r.namespace, r.accept) for r in api.sent} == {
        ("LIST", "GET", "ns", METADATA_LIST)
    }


async def test_a_list_answered_without_its_version_is_an_error_not_an_empty_list() -> None:
    with pytest.raises(ServerError):
        await collect(Recorder({"kind": "SecretList", "items": []}).pages(SECRETS))


async def test_a_watch_asks_for_bookmarks_from_a_version() -> None:
    api = Recorder()
    events = api.watch(SECRETS, resource_version="5", label_selector="x", timeout_seconds=9)
    assert [e async for e in events] == [("OPEN", {})]
    assert api.sent == [
        Request(
            "WATCH",
            SECRETS,
            query=(
                ("watch", "true"),
                ("resourceVersion", "5"),
                ("allowWatchBookmarks", "true"),
                ("timeoutSeconds", "9"),
                ("labelSelector", "x"),
            ),
        )
    ]


async def test_each_call_is_one_request_of_its_verb_path_query_body_and_media_types() -> None:
    api = Recorder()
    body = {"metadata": {"name": "s", "resourceVersion": "3"}}
    await api.get(SECRETS, "s", namespace="ns", metadata_only=True)
    await api.create(SECRETS, b"{}", namespace="ns")
    await api.replace(SECRETS, body, namespace="ns", metadata_only=True)
    await api.delete(SECRETS, "s", namespace="ns", only_if=Precondition(uid="u"))
    await api.patch_status(SECRETS, "g", {"ready": True})
    await api.apply(SECRETS, body, namespace="ns", field_manager="fm")
    ours = (("fieldManager", "projector"),)
    options = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": "u"}}
    assert api.sent == [
        Request("GET", SECRETS, "ns", "s", accept=METADATA_ONLY),
        Request("CREATE", SECRETS, "ns", query=ours, body=b"{}", accept=JSON),
        Request("UPDATE", SECRETS, "ns", "s", query=ours, body=body, accept=METADATA_ONLY),
        Request("DELETE", SECRETS, "ns", "s", body=options),
        Request(
            "PATCH",
            SECRETS,
            None,
            "g",
            "status",
            body={"status": {"ready": True}},
            content_type=MERGE_PATCH,
        ),
        Request(
            "PATCH",
            SECRETS,
            "ns",
            "s",
            query=(("fieldManager", "fm"), ("force", "true")),
            body=body,
            content_type=APPLY_PATCH,
        ),
    ]
    assert [r.method for r in api.sent] == ["GET", "POST", "PUT", "DELETE", "PATCH", "PATCH"]
