"""Calling actors: a rank's calls to a dask actor that block, notice a stop request and time out loudly, and one
call to each of several actors under one deadline.

Its public face: the names below, each imported from its module on first use, so that importing one module of this
package (a grading kernel imports `ranks.thread_group` alone) does not import the others.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import lazy_face

if TYPE_CHECKING:
    from .actor_calls import ActorCalls, pack, unpack
    from .replies import NoReply, call_each
    from .retries import StopFlag, Stopped, repeat_until, retry

_FROM = {
    "ActorCalls": "actor_calls",
    "pack": "actor_calls",
    "unpack": "actor_calls",
    "NoReply": "replies",
    "call_each": "replies",
    "StopFlag": "retries",
    "Stopped": "retries",
    "repeat_until": "retries",
    "retry": "retries",
}
__all__ = ["ActorCalls", "NoReply", "StopFlag", "Stopped", "call_each", "pack", "repeat_until", "retry", "unpack"]

__getattr__ = lazy_face(__name__, _FROM)
