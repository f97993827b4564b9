"""A pure-PyTorch, API-compatible model of the ``deep_ep`` Python API.

Drop-in usage: ``import conformance.emulation as deep_ep``.  Runs over any ``torch.distributed``
process group (gloo with CPU tensors, NCCL with CUDA tensors) and reproduces the real library's
recorded outputs (``fixtures/deepep-real``).  See ``DIVERGENCES.md`` for every deliberate difference.
"""

import torch

from conformance import EMULATION_VERSION

from . import utils
from .config import Config
from .elastic import ElasticBuffer, EPHandle
from .legacy import Buffer
from .utils.event import EventHandle, EventOverlap

topk_idx_t = torch.int64
__version__ = EMULATION_VERSION
IS_EMULATION = True

__all__ = [
    "Buffer",
    "ElasticBuffer",
    "EPHandle",
    "EventOverlap",
    "EventHandle",
    "Config",
    "topk_idx_t",
    "utils",
    "IS_EMULATION",
]
