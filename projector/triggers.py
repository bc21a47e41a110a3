"""Pure: which grant names an observed change affects, answered from indexes kept here.

Level-based like controller-runtime: a change only says *which* grants to look at again; the
reconcile then reads the whole current state. Indexes keep each lookup proportional to the
grants concerned, not to all grants: source -> grants, namespace -> grants (explicit lists),
grants with a selector, grant uid -> name, and target name -> grants (rivals for one copy).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from collections.abc import Set as AbstractSet

from projector.model import GRANT_LABEL, Copy, Grant, GrantRecord, Namespace, ObjectKey, Source


class Triggers:
    """Indexes over the cached grants, updated on every grant change."""

    def __init__(self) -> None:
        self._grants: dict[str, Grant] = {}
        self._uid_to_name: dict[str, str] = {}
        self._by_source: defaultdict[ObjectKey, set[str]] = defaultdict(set)
        self._by_namespace: defaultdict[str, set[str]] = defaultdict(set)
        self._by_target: defaultdict[str, set[str]] = defaultdict(set)
        self._with_selector: set[str] = set()

    def _unindex(self, name: str) -> None:
        g = self._grants.pop(name, None)
        if g is None:
            return
        self._by_source[g.source].discard(name)
        self._by_target[g.target_name].discard(name)
        for ns in g.namespaces:
            self._by_namespace[ns].discard(name)
        self._with_selector.discard(name)

    def grant_changed(self, old: GrantRecord | None, new: GrantRecord | None) -> set[str]:
        """Re-index a grant; affected: itself and the grants it competes with for copies."""
        names: set[str] = set()
        for rec in (old, new):
            if rec is None:
                continue
            names.add(rec.name)
            if rec.grant is not None:
                names |= self._by_target.get(rec.grant.target_name, set())
        if old is not None:
            self._uid_to_name.pop(old.uid, None)
            self._unindex(old.name)
        if new is not None:
            self._uid_to_name[new.uid] = new.name
            g = new.grant
            if g is not None:
                self._grants[new.name] = g
                self._by_source[g.source].add(new.name)
                self._by_target[g.target_name].add(new.name)
                for ns in g.namespaces:
                    self._by_namespace[ns].add(new.name)
                if g.selector is not None:
                    self._with_selector.add(new.name)
        return names

    def source_changed(self, old: Source | None, new: Source | None) -> set[str]:
        """Grants that project this source."""
        src = new or old
        return set(self._by_source.get(src.key, ())) if src is not None else set()

    def namespace_changed(self, old: Namespace | None, new: Namespace | None) -> set[str]:
        """Grants that list the namespace, or whose selector matched it before or after."""
        ns = new or old
        if ns is None:
            return set()
        names = set(self._by_namespace.get(ns.name, ()))
        for name in self._with_selector:
            g = self._grants[name]
            if any(n is not None and g.targets(n.name, n.labels) for n in (old, new)):
                names.add(name)
        return names

    def copy_changed(self, old: Copy | None, new: Copy | None) -> set[str]:
        """The grant a copy names in its label, and the grant that owns it by uid.

        Rivals for the same copy are woken only when a copy is deleted (its place is free);
        other copy events stay O(1) however many grants share a target name.
        """
        names: set[str] = set()
        for c in (old, new):
            if c is None:
                continue
            label = c.labels.get(GRANT_LABEL)
            if label:
                names.add(label)
            owner = self._uid_to_name.get(c.grant_uid or "")
            if owner:
                names.add(owner)
        if old is not None and new is None:  # a freed place: a waiting rival may take it now
            names |= self._by_target.get(old.key.name, set())
        return names

    def live_uids(self) -> AbstractSet[str]:
        """Uids of every grant that exists (valid or not): their copies are never orphans.

        A live view, not a copy: it is read once per reconcile, and copying it would cost
        O(grants) on every reconcile.
        """
        return self._uid_to_name.keys()

    def rivals(self, grant: Grant) -> tuple[Grant, ...]:
        """Other valid grants with the same target name."""
        return tuple(
            self._grants[n] for n in self._by_target.get(grant.target_name, ()) if n != grant.name
        )

    def grant_names(self) -> Iterable[str]:
        """Every indexed (valid) grant name."""
        return self._grants.keys()
