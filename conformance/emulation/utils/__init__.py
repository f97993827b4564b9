"""``deep_ep.utils`` stand-in: integrators import ``EventOverlap`` / ``EventHandle`` from here."""

from .event import EventHandle, EventOverlap

__all__ = ["EventHandle", "EventOverlap"]
