"""The version of ``conformance.json`` and how older reports are read (a kept baseline may be years old).

- schema 2: one status per property (no per-backend verdicts); V2's cached-dispatch ``TypeError`` was a divergence.
  The gate derives columns from it (``gate.columns``) and reads that divergence as the known defect it is now.
- schema 3: per-backend / per-pair verdicts (``verdicts``), known defects (``known_defects``), API coverage.
- schema 4: each backend in ``environment.backends`` says its ``contract`` (``V1``: ``Buffer``-shaped, ``V2``: the
  elastic API, ``ElasticBuffer`` on 2.1.0, ``EPBuffer`` on 2.5.0: the role the gate matches backends by across
  versions) and, for a plug-in, ``wrapper``: what the wrapper checked to decide whether it drives DeepEP (its own
  flags, e.g. Megatron's ``HAVE_DEEP_EP_V2``), or ``null`` when it declares nothing; with ``--baseline``, ``gate``
  also holds ``bump`` (the explanation of the version bump, ``reporting.bump``), ``findings`` and ``accepted``.

:func:`upgrade` returns a report of any earlier schema in schema 4's form (what the gate and the bump read).
"""

from __future__ import annotations

import copy
from typing import Any

from conformance.core.ids import is_pair

SCHEMA = 4


def contract_of(backend: dict[str, Any]) -> str:
    """``V1`` or ``V2``: the API contract a backend entry follows (its ``contract``; in older reports read from its
    class name, ``Buffer`` being V1, or its name: ``real-v1``, ``v1=pkg:Class``)."""
    if backend.get("contract") in ("V1", "V2"):
        return backend["contract"]
    api = str(backend.get("api") or "")
    if api:
        return "V1" if api in ("Buffer", "v1") else "V2"
    name = str(backend.get("name") or "")
    return "V1" if name.endswith("-v1") or name.startswith("v1=") else "V2"


def upgrade(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` (schema 2, 3 or 4) in schema 4's form, as a copy; ``ValueError`` for a newer schema.  The
    schema it was written with stays readable as ``schema_written``."""
    written = document.get("schema", 2)
    if not isinstance(written, int) or written > SCHEMA:
        raise ValueError(f"report schema {written!r} is newer than this suite reads ({SCHEMA}): update the suite")
    out = copy.deepcopy(document)
    out["schema_written"] = written
    out["schema"] = SCHEMA
    env = out.setdefault("environment", {})
    backends = env.setdefault("backends", [])
    listed = {b.get("name") for b in backends}
    for p in out.get("properties", []):  # schema 2 lists backends per property; a column names a backend too
        for name in [*p.get("backends", []), *p.get("verdicts", {})]:
            if not is_pair(name) and name not in listed:
                listed.add(name)
                backends.append({"name": name, "real": name.startswith("real-")})
    for backend in backends:
        backend["contract"] = contract_of(backend)
        if "plugin" in backend:
            backend.setdefault("wrapper", None)
    return out
