"""The only code that writes copies: executes a plan's steps, never decides what to write.

Writes are concurrent up to a bound shared by every reconcile, carry optimistic-concurrency
preconditions (PUT with the cached resourceVersion; DELETE with uid and resourceVersion), and
retry transient failures (5xx, lost connections, 429 after its Retry-After) a few times with
tenacity before reporting the step as failed, which makes the controller requeue the grant.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)
from tenacity.wait import wait_base

from projector.errors import ApiError, Conflict, Forbidden, NotFound, TooManyRequests
from projector.kube import SECRETS, Kube
from projector.model import GRANT_UID_ANNOTATION, marked_by_projector, parse_copy
from projector.reconcile import Action, Desired, Outcome, Plan, Reason, Step

WriteHook = Callable[[Step, str], None]
"""Called after each write with the step and its result: ok, error or conflict."""


class _RetryAfterOrBackoff(wait_base):
    """Honour a 429's Retry-After; otherwise exponential backoff with jitter."""

    def __init__(self) -> None:
        self._backoff = wait_exponential_jitter(initial=0.05, max=2.0)

    def __call__(self, retry_state: Any) -> float:
        outcome = retry_state.outcome
        err = outcome.exception() if outcome is not None else None
        if isinstance(err, TooManyRequests):
            return float(err.retry_after)
        return float(self._backoff(retry_state))


def _transient(e: BaseException) -> bool:
    return isinstance(e, ApiError) and e.transient and not isinstance(e, Conflict)


class Writer:
    """Executes plans against the API with bounded concurrency and retries."""

    def __init__(
        self,
        kube: Kube,
        *,
        concurrency: int = 32,
        attempts: int = 4,
        on_write: WriteHook | None = None,
    ) -> None:
        self.kube = kube
        self._slots = asyncio.Semaphore(concurrency)
        self._attempts = attempts
        self._on_write = on_write

    async def execute(self, plan: Plan) -> list[Outcome]:
        """Run every write of the plan; NoOp steps pass through as outcomes unchanged."""
        outcomes: list[Outcome] = [
            Outcome(s, s.reason, s.message) for s in plan.steps if s.action is Action.NOOP
        ]
        writes = plan.writes
        if writes:
            outcomes.extend(await asyncio.gather(*(self._run(plan, s) for s in writes)))
        return outcomes

    async def _run(self, plan: Plan, step: Step) -> Outcome:
        async with self._slots:
            try:
                async for attempt in AsyncRetrying(
                    stop=stop_after_attempt(self._attempts),
                    wait=_RetryAfterOrBackoff(),
                    retry=retry_if_exception(_transient),
                    reraise=True,
                ):
                    with attempt:
                        outcome = await self._write(plan, step)
            except ApiError as e:
                self._hook(step, "error")
                return Outcome(
                    step, Reason.WRITE_FAILED, f"{step.action.value}: {e.status} {e.reason}"
                )
            result = {Reason.WRITE_FAILED: "error", Reason.CONFLICT: "conflict"}.get(
                outcome.reason, "ok"
            )
            self._hook(step, result)
            return outcome

    def _hook(self, step: Step, result: str) -> None:
        if self._on_write is not None:
            self._on_write(step, result)

    async def _write(self, plan: Plan, step: Step) -> Outcome:
        ns, desired = step.namespace, plan.desired
        if step.action is Action.DELETE:
            return await self._delete(step)
        assert desired is not None, "a create/update plan always has desired content"
        if step.action is Action.REPLACE:
            deleted = await self._delete(step)
            if deleted.reason is Reason.WRITE_FAILED:
                return deleted
            return await self._create(plan, step, desired)
        if step.action is Action.UPDATE and step.existing is not None:
            body = desired.manifest(ns, step.existing.resource_version, keep=step.existing)
            try:
                await self.kube.replace(SECRETS, body, namespace=ns)
            except NotFound:
                return await self._create(plan, step, desired)
            return Outcome(step, Reason.PROJECTED, written=True)
        return await self._create(plan, step, desired)

    async def _create(self, plan: Plan, step: Step, desired: Desired) -> Outcome:
        ns = step.namespace
        try:
            await self.kube.create(SECRETS, desired.manifest(ns), namespace=ns)
            return Outcome(step, Reason.PROJECTED, written=True)
        except Conflict as e:
            if not e.already_exists:
                raise
        except NotFound:
            return Outcome(step, Reason.NAMESPACE_MISSING, "namespace not found")
        except Forbidden as e:
            if "terminat" in e.message:
                return Outcome(step, Reason.TERMINATING)
            raise
        # The name is taken by a Secret our cache does not hold: ours only if it says so.
        meta = await self.kube.get(SECRETS, desired.name, namespace=ns, metadata_only=True)
        meta = meta.get("metadata") or {}
        grant = plan.grant
        owner = (meta.get("annotations") or {}).get(GRANT_UID_ANNOTATION)
        if grant is None or owner != grant.uid or not marked_by_projector(meta):
            return Outcome(
                step, Reason.CONFLICT, "a Secret of that name exists and is not owned by this grant"
            )
        stored = parse_copy({"metadata": {**meta, "namespace": ns, "name": desired.name}})
        body = desired.manifest(ns, str(meta.get("resourceVersion", "")), keep=stored)
        await self.kube.replace(SECRETS, body, namespace=ns)
        return Outcome(step, Reason.PROJECTED, written=True)

    async def _delete(self, step: Step) -> Outcome:
        copy = step.existing
        assert copy is not None, "a delete always names the copy it deletes"
        try:
            await self.kube.delete(
                SECRETS,
                copy.key.name,
                namespace=copy.key.namespace,
                uid=copy.uid,
                resource_version=copy.resource_version,
            )
        except NotFound:
            pass  # already gone: the goal is reached
        except Conflict:
            # The copy changed since we decided: decide again on fresh state.
            return Outcome(step, Reason.WRITE_FAILED, "copy changed since planned; will retry")
        return Outcome(step, step.reason, written=True)
