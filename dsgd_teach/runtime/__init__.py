"""The runtime beneath the rank loops: calls to dask actors that block, notice a stop request and time out loudly."""

from .actor_calls import ActorCalls, pack, unpack

__all__ = ["ActorCalls", "pack", "unpack"]
