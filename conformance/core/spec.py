"""Naming and selecting backends: ``{emulated,real}-{v1,v2}``."""

from __future__ import annotations

from dataclasses import dataclass

APIS = {"v1": "Buffer", "v2": "ElasticBuffer"}
IMPLS = ("emulated", "real")


@dataclass(frozen=True)
class BackendSpec:
    """One backend: an API (``v1`` = ``deep_ep.Buffer``, ``v2`` = ``deep_ep.ElasticBuffer``) of one implementation."""

    impl: str  # "emulated" | "real"
    api: str  # "v1" | "v2"

    @property
    def name(self) -> str:
        """``impl-api``, e.g. ``emulated-v2``."""
        return f"{self.impl}-{self.api}"

    @property
    def real(self) -> bool:
        """Whether this is the real ``deep_ep``."""
        return self.impl == "real"

    @property
    def class_name(self) -> str:
        """The deep_ep class this backend drives."""
        return APIS[self.api]

    @classmethod
    def parse(cls, text: str) -> BackendSpec:
        """Parse ``emulated-v1`` style names; raise ``ValueError`` naming the valid choices."""
        impl, _, api = text.strip().partition("-")
        if impl not in IMPLS or api not in APIS:
            raise ValueError(
                f"unknown backend {text!r}: expected one of "
                + ", ".join(f"{i}-{a}" for i in IMPLS for a in APIS)
                + " (or 'auto', 'emulated', 'real')"
            )
        return cls(impl, api)


def parse_backends(option: str, real_available: bool) -> list[BackendSpec]:
    """Resolve the ``--backends`` option.

    ``auto``: both real APIs when the real ``deep_ep`` is usable here, else both emulated ones.
    ``emulated`` / ``real``: both APIs of that implementation.  Otherwise a comma-separated list of names.
    Raises ``ValueError`` naming the option and the allowed values.
    """
    option = option.strip()
    if option == "auto":
        option = "real" if real_available else "emulated"
    if option in IMPLS:
        specs = [BackendSpec(option, api) for api in APIS]
    else:
        specs = [BackendSpec.parse(part) for part in option.split(",") if part.strip()]
    if not specs:
        raise ValueError("--backends selected no backend")
    if len(set(specs)) != len(specs):
        raise ValueError(f"--backends names a backend twice: {option!r}")
    return specs


def wants_real(option: str) -> bool:
    """Whether ``--backends`` explicitly asks for a real backend (``auto`` does not insist)."""
    return any(part.strip().startswith("real") for part in option.split(","))
