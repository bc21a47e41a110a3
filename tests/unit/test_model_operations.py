"""The model-based tests' operations: a printed case replays as itself, a seed draws the same
operations every time, and the drawn runs are not vacuous."""

from __future__ import annotations

import typing
from collections import Counter

from tests.model import operations
from tests.model.operations import (
    INITIAL_PACKS,
    Converge,
    Generator,
    GrantCreate,
    GrantUpdate,
    View,
    render,
)


def view() -> View:
    return View(dict(INITIAL_PACKS), {}, {}, frozenset(), frozenset(), True, False)


def draw(seed: int, count: int = 200) -> list[operations.Op]:
    gen, v, out = Generator(seed, operations.FAULTS), view(), []
    for _ in range(count):
        op = gen.next(v)
        out.append(op)
        if isinstance(op, GrantCreate) and not isinstance(op, GrantUpdate):
            v = View(v.namespaces, v.sources, {**v.grants, op.grant: op}, *_rest(v))
        if isinstance(op, operations.SourceCreate):
            v = View(v.namespaces, {**v.sources, (op.ns, op.name): op.type}, v.grants, *_rest(v))
    return out


def _rest(v: View) -> tuple[frozenset[tuple[str, str]], frozenset[tuple[str, str]], bool, bool]:
    return v.squatters, v.copies, v.controller_up, v.watches_cut


def test_a_printed_case_replays_as_itself() -> None:
    ops = draw(7)
    text = "[\n" + render(ops) + "\n]"
    assert eval(text, vars(operations)) == ops


def test_a_seed_draws_the_same_operations_every_time() -> None:
    assert draw(11) == draw(11)
    assert draw(11) != draw(12)


def test_drawn_runs_make_every_kind_of_operation() -> None:
    kinds = Counter(type(op).__name__ for seed in range(1, 6) for op in draw(seed))
    # (creating a namespace, editing a copy, starting the controller and the like need what
    # this draw's view does not keep)
    unseen = {"NsCreate", "CopyEdit", "CopyDelete", "Unsquat", "Start", "RestoreWatches"}
    expected = {t.__name__ for t in typing.get_args(operations.Op)} - unseen
    assert expected <= set(kinds), expected - set(kinds)
    assert kinds["Converge"] >= 5 * 200 // 15
    assert Converge() in draw(1)
