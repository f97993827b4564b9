"""``deep_ep.utils`` stand-in.  As in DeepEP 2.1.0 it exports ``EventHandle`` only ("for forward compatibility");
``EventOverlap`` lives in ``deep_ep.utils.event`` and at the package's top level.  (``from deep_ep.utils import
EventOverlap`` fails on the real 2.1.0, so it fails here too: recorded on nvidia-h200,
docs/real-runs/api-surface-real-2.1.0.json.)"""

from .event import EventHandle

__all__ = ["EventHandle"]
