"""``deep_ep.utils`` of DeepEP 2.5.0: as in 2.1.0 it exports ``EventHandle`` only ("for forward compatibility",
deep_ep/utils/__init__.py); ``EventOverlap`` lives in ``deep_ep.utils.event`` and at the package's top level."""

from .event import EventHandle

__all__ = ["EventHandle"]
