"""ZeRO's sharding units: every trainable parameter of any module, once, grouped by the module that owns it.

A unit is the set of parameters one module owns directly (a Linear's weight and bias, a LayerNorm's scale and
shift, an Embedding's table): finer than FSDP's units (Zhao et al. 2023, section 3.2), which wrap a whole subtree
such as a transformer block. Modules that share a
parameter (tied input and output embeddings) form one unit, so a shared parameter is sharded, reduced and updated
once. Frozen parameters (requires_grad=False) belong to no unit: every rank keeps them whole and nobody updates them.

A unit's parameters, laid end to end and padded to a multiple of N, are cut into N equal shards; rank r owns
elements [r·S, (r+1)·S) with S = padded / N. Under stage 3 a parameter holds memory only while its unit is
gathered; reading it otherwise raises an error that says how to get the full values, instead of reading freed memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .shard_ops import padded_numel

#: What may be asked of a ZeRO-3 parameter whose memory is freed: its shape and type, never its values.
METADATA = frozenset({"__get__", "__set__", "numel", "nelement", "size", "dim", "element_size", "untyped_storage",
                      "register_post_accumulate_grad_hook", "register_hook", "requires_grad_", "__hash__"})


class Unit:
    """One sharding unit: the modules that own its parameters, their names, padded flat size and this rank's range."""

    def __init__(self, modules: list[torch.nn.Module], named: list[tuple[str, torch.nn.Parameter]], world: int,
                 rank: int) -> None:
        self.modules = modules
        self.names, self.params = [n for n, _ in named], [p for _, p in named]
        self.numel = sum(p.numel() for p in self.params)
        self.padded = padded_numel(self.numel, world)
        self.size = self.padded // world
        self.lo = rank * self.size
        self.full = torch.empty(0)  # the padded parameters (stage 3: allocated only while gathered)
        self.shard = torch.empty(0)  # stage 3: this rank's shard of the parameters, kept between steps
        self.grad_full: torch.Tensor | None = None  # stages 0-1: the padded gradient, each p.grad a view of it
        self.grad_shard: torch.Tensor | None = None  # this rank's shard of the summed gradient
        self.waiting = len(self.params)

    def flat(self, tensors: list[torch.Tensor | None]) -> torch.Tensor:
        """tensors (one per parameter; None counts as zeros) laid end to end and zero-padded to the padded size."""
        p0 = self.params[0]
        out = torch.empty(self.padded, dtype=p0.dtype, device=p0.device)  # one copy of each tensor, no more
        for view, t in zip(self.views(out), tensors, strict=True):
            if t is None:
                view.zero_()
            else:
                view.copy_(t)
        out[self.numel:].zero_()
        return out

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's slice of a padded flat vector, shaped like the parameter (no copy)."""
        out, offset = [], 0
        for p in self.params:
            out.append(flat[offset:offset + p.numel()].view(p.shape))
            offset += p.numel()
        return out

    def gathered(self) -> bool:
        """Whether the unit's full parameters are in memory (always, below stage 3)."""
        return self.full.untyped_storage().nbytes() > 0


def find_units(model: torch.nn.Module, world: int, rank: int) -> list[Unit]:
    """The model's units, in the order their parameters are registered: every trainable parameter in exactly one."""
    names = {id(p): n for n, p in model.named_parameters()}  # a shared parameter under its first name
    groups: list[tuple[list[torch.nn.Module], list[torch.nn.Parameter]]] = []
    group_of: dict[int, int] = {}
    for module in model.modules():
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        if not own:
            continue
        found = sorted({group_of[id(p)] for p in own if id(p) in group_of})
        if not found:
            groups.append(([], []))
            found = [len(groups) - 1]
        keep = found[0]
        for other in found[1:]:  # a module tying two units together: merge them
            groups[keep][0].extend(groups[other][0])
            groups[keep][1].extend(groups[other][1])
            groups[other] = ([], [])
            for p in groups[keep][1]:
                group_of[id(p)] = keep
        groups[keep][0].append(module)
        for p in own:
            if id(p) not in group_of:
                group_of[id(p)] = keep
                groups[keep][1].append(p)
    order = [id(p) for p in model.parameters()]
    units = []
    for modules, params in groups:
        if params:
            params.sort(key=lambda p: order.index(id(p)))
            units.append(Unit(modules, [(names[id(p)], p) for p in params], world, rank))
    units.sort(key=lambda u: order.index(id(u.params[0])))
    return units


def output_tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in a (nested: tuples, lists, dicts) output of a module's forward."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in output_tensors(v)]
    return []


class ShardedParameter(torch.nn.Parameter):
    """A ZeRO-3 parameter: used as itself while its unit is gathered, a clear error when its memory is freed."""

    zero_unit: Unit | None = None
    zero_name: str = ""
    zero_world: int = 1

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        """Refuse to read a freed parameter's values; otherwise run func as on a plain tensor."""
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") not in METADATA or func is torch.Tensor.data.__get__:
            for arg in (*args, *kwargs.values()):
                for t in arg if isinstance(arg, (list, tuple)) else (arg,):
                    if isinstance(t, ShardedParameter) and t.zero_unit is not None and not t.zero_unit.gathered():
                        raise RuntimeError(
                            f"parameter {t.zero_name!r} is sharded over {t.zero_world} ranks by ZeRO stage 3: "
                            "outside its module's forward and backward it holds no values. Read the full "
                            "parameters inside `with zero.gathered():` (every rank must enter it), or call "
                            "zero.full_params() or zero.state_dict()")
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


def shard_parameters(model: torch.nn.Module, unit: Unit, world: int) -> None:
    """Replace the unit's parameters, wherever the model holds them, by ShardedParameters on the same data."""
    for i, (name, p) in enumerate(zip(unit.names, unit.params, strict=True)):
        sp = ShardedParameter(p.detach(), requires_grad=True)
        sp.zero_unit, sp.zero_name, sp.zero_world = unit, name, world
        for module in model.modules():
            for key, q in list(module._parameters.items()):
                if q is p:
                    module._parameters[key] = sp
        unit.params[i] = sp


def bucket_units(units: list[Unit], cap_bytes: int, world: int, rank: int) -> list[Unit]:
    """Units merged into buckets, in reverse order of registration (the order backward produces them), each closed
    once it holds cap_bytes; the buckets listed in registration order. Stages 0-2 reduce a bucket at a time."""
    merged: list[list[Unit]] = []
    current: list[Unit] = []
    filled = 0
    for u in reversed(units):
        current.append(u)
        filled += sum(p.numel() * p.element_size() for p in u.params)
        if filled >= cap_bytes:
            merged.append(current)
            current, filled = [], 0
    if current:
        merged.append(current)
    buckets = []
    for group in reversed(merged):
        group = group[::-1]
        modules = [m for u in group for m in u.modules]
        named = [(n, p) for u in group for n, p in zip(u.names, u.params, strict=True)]
        buckets.append(Unit(modules, named, world, rank))
    return buckets


def refuse_missing(units: list[Unit], fired: set[int], rank: int, on_refusal: Callable[[], None]) -> None:
    """A ValueError naming the parameters of units that backward gave no gradient (ids not in fired)."""
    missing = [n for u in units for n, p in zip(u.names, u.params, strict=True) if id(p) not in fired]
    if missing:
        on_refusal()
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ValueError(f"ZeroAdam: parameter(s) {shown} got no gradient on rank {rank} (not used to "
                         "compute the loss); freeze them with requires_grad_(False), or pass unused='zero' to "
                         "count their gradient as zero")
