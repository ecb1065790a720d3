"""The settings ``dspark bench`` compares and the order it runs them in.

``Setting`` (no speculation, a fixed K or adaptive verification, and ``--variant``'s
adaptive variants with ``EngineConfig`` fields changed), the parsing and checking of
``--variant``, and ``job_order``: the interleaved (repeat, level, setting) run order.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields, replace

from dspark.engine.config import AdaptiveConfig, EngineConfig


@dataclass(frozen=True)
class Setting:
    spec: str  # none | fixed | adaptive
    k: int  # fixed: the K; adaptive: the most drafts per request
    tag: str = ""  # a variant's name (``--variant``), shown after the label
    # A variant's EngineConfig or AdaptiveConfig fields, as (name, value) pairs.
    overrides: tuple[tuple[str, object], ...] = ()

    @property
    def label(self) -> str:
        base = {"none": "no spec", "fixed": f"K={self.k}", "adaptive": f"adaptive≤{self.k}"}
        return base[self.spec] + (f" {self.tag}" if self.tag else "")


def parse_variant(text: str, k: int) -> Setting:
    """``--variant TAG:FIELD=VALUE[,FIELD=VALUE...]``: adaptive verification with those
    ``EngineConfig`` (or ``AdaptiveConfig``) fields changed, run as one more setting of
    every level (interleaved with the others in the same repeats, so it can be compared
    pairwise)."""
    tag, sep, assignments = text.partition(":")
    tag = tag.strip()
    if not sep or not assignments.strip() or not tag.isidentifier():
        raise ValueError(
            f"--variant must be TAG:FIELD=VALUE[,FIELD=VALUE...] with a tag of letters, "
            f"digits and underscores, got {text!r}"
        )
    types = {f.name: f.type for f in fields(AdaptiveConfig)}
    types.update((f.name, f.type) for f in fields(EngineConfig) if f.name != "adaptive")
    overrides = []
    for assignment in assignments.split(","):
        name, sep, value = (part.strip() for part in assignment.partition("="))
        if not sep or name not in types or name in ("spec", "num_drafts", "max_num_seqs"):
            raise ValueError(
                f"--variant {text!r}: {assignment.strip()!r} must set an EngineConfig or "
                "AdaptiveConfig field other than spec, num_drafts and max_num_seqs (the "
                "bench sets those), e.g. settle=off"
            )
        overrides.append((name, _config_value(name, types[name], value)))
    return Setting("adaptive", k, tag, tuple(overrides))


def _config_value(name: str, kind, value: str) -> object:
    """``value`` as the EngineConfig field ``name`` holds it (its annotation is a string
    under postponed evaluation)."""
    kind = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
    lowered = value.lower()
    if kind == "bool":
        if lowered in ("1", "true", "on", "yes"):
            return True
        if lowered in ("0", "false", "off", "no"):
            return False
        raise ValueError(f"--variant: {name} takes on or off, got {value!r}")
    if lowered == "none" and "None" in kind:
        return None
    try:
        if kind.startswith("int"):
            return int(value)
        if kind.startswith("float"):
            return float(value)
    except ValueError:
        raise ValueError(f"--variant: {name} takes a number ({kind}), got {value!r}") from None
    return value


def checked_variants(args: argparse.Namespace) -> list[Setting]:
    """``--variant`` settings, each checked as an ``EngineConfig`` (its own validation)
    and against the others, so that a bad one fails before any run, not in its first."""
    variants = [parse_variant(text, args.k) for text in args.variant]
    if len({v.tag for v in variants}) != len(variants):
        raise ValueError(f"--variant tags must differ, got {[v.tag for v in variants]}")
    if variants and args.no_adaptive:
        raise ValueError("--variant runs adaptive variants: it cannot go with --no-adaptive")
    for variant in variants:
        try:
            engine_config({"spec": "adaptive", "num_drafts": args.k}, variant.overrides)
        except (TypeError, ValueError) as error:
            raise ValueError(f"--variant {variant.tag}: {error}") from None
    return variants


def engine_config(values: dict, overrides: tuple[tuple[str, object], ...] = ()) -> EngineConfig:
    """An ``EngineConfig`` of ``values`` with ``overrides`` on top, each override going to
    ``EngineConfig`` or to its ``AdaptiveConfig``, whichever has the field."""
    adaptive_names = {f.name for f in fields(AdaptiveConfig)}
    adaptive = {name: value for name, value in overrides if name in adaptive_names}
    config = EngineConfig(**{**values, **{n: v for n, v in overrides if n not in adaptive_names}})
    return replace(config, adaptive=replace(config.adaptive, **adaptive)) if adaptive else config


def job_order(
    repeats: int, concurrency: list[int], settings: list[Setting]
) -> list[tuple[int, int, Setting]]:
    """(repeat, level, setting) in run order: repeats outermost, a level's settings
    reversed on every other repeat (a drift over the run then hits them alike)."""
    return [
        (repeat, level, setting)
        for repeat in range(repeats)
        for level in concurrency
        for setting in (settings if repeat % 2 == 0 else settings[::-1])
    ]
