"""The engine's settings: ``EngineConfig``, with the adaptive policy's in ``AdaptiveConfig``."""

from __future__ import annotations

import enum
import numbers
from dataclasses import asdict, dataclass, field

from dspark.engine.graphs import CAPTURE_AFTER_WASTE

SWITCHES = ("auto", "on", "off")
"""Values of a tri-state setting; "auto" picks per device, as each setting says."""


class SpecMode(str, enum.Enum):
    NONE = "none"  # no speculation
    FIXED = "fixed"  # verify every draft of K
    ADAPTIVE = "adaptive"  # the budget and allocation of ``dspark.scheduling``


def _switch(name: str, value: str) -> None:
    if value not in SWITCHES:
        raise ValueError(f"{name} must be 'auto', 'on' or 'off', got {value!r}")


def switched_on(value: str, auto: bool) -> bool:
    """Whether a tri-state setting is on, ``auto`` saying what "auto" means here."""
    return value == "on" or (value == "auto" and auto)


@dataclass(frozen=True, slots=True)
class AdaptiveConfig:
    """How adaptive verification runs in the engine (``docs/design.md`` says what each
    mechanism buys and which measurement shows it)."""

    # Also decide whether to draft at all from measured tokens/ms of drafted and undrafted steps.
    throughput_gate: bool = True
    # Decide the next step's depth and budget while the device runs this step's forward.
    lookahead: str = "auto"
    # Stop deciding while decided steps buy less than their host time costs ("auto": CUDA).
    settle: str = "auto"
    # Raise a cut budget into the padding of the CUDA graph the step replays anyway.
    fill_padding: bool = True
    # Batch the drafter's context updates of undrafted steps until a step drafts.
    defer_upkeep: bool = True

    def __post_init__(self) -> None:
        _switch("lookahead", self.lookahead)
        _switch("settle", self.settle)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    max_num_seqs: int = 64  # requests in flight at once
    max_num_batched_tokens: int = 2048  # tokens of one step, drafts included
    max_model_len: int | None = None  # None: the model's positions, up to the KV cache
    kv_cache_tokens: int = 65536  # KV cache size in tokens (blocks of ``block_size``)
    block_size: int = 16  # tokens per KV cache block
    spec: SpecMode = SpecMode.NONE  # none | fixed | adaptive
    num_drafts: int = 4  # K: drafts proposed per decoding request
    seed: int = 0  # seeds requests that bring none of their own
    # "auto": the shipped DSpark drafter when one matches the model, else "ngram";
    # "dspark": the shipped one (an error if none matches); or a drafter directory.
    drafter: str = "auto"
    # The drafter's reduced vocabulary (draft_vocab.npy): "auto" is on for CPU only.
    draft_vocab: str = "auto"
    # Padded steps replayed as CUDA graphs: "auto" on CUDA; "on" on CPU runs them eagerly.
    cuda_graphs: str = "auto"
    # Steps' worth of padding a new shape replays on a larger graph before it is captured.
    graph_padding_budget: float = CAPTURE_AFTER_WASTE
    # Each sequence slot owns a run of KV blocks, read in place by eager attention ("auto": CPU).
    kv_regions: str = "auto"
    # Adaptive: read the start-up cost profile from here if it matches, else write it here.
    profile_path: str | None = None
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    # Ranks the target is split over (one process each; docs/design.md, tensor parallelism).
    tensor_parallel_size: int = 1
    # A rank that gives no answer for this long (a plan, a collective) is reported stalled.
    tp_timeout_s: float = 60.0
    # How long the workers may take to load their shards and join.
    tp_start_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "spec", SpecMode(self.spec))
        self._check_tensor_parallel()
        for name in ("draft_vocab", "cuda_graphs", "kv_regions"):
            _switch(name, getattr(self, name))
        budget = self.graph_padding_budget
        if (
            not (isinstance(budget, numbers.Real) and not isinstance(budget, bool))
            or not budget >= 0
        ):
            raise ValueError(
                "graph_padding_budget must be a number of steps >= 0 (0: capture every new "
                f"shape at once), got {budget!r}"
            )
        if not isinstance(self.adaptive, AdaptiveConfig):
            raise ValueError(f"adaptive must be an AdaptiveConfig, got {self.adaptive!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "kv_cache_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.spec is not SpecMode.NONE and self.num_drafts < 1:
            raise ValueError(
                f"num_drafts (K) must be at least 1 with speculation, got {self.num_drafts}"
            )
        if self.max_model_len is not None and not 1 < self.max_model_len <= self.kv_cache_tokens:
            raise ValueError(
                f"max_model_len ({self.max_model_len}) must be at least 2 and fit "
                f"kv_cache_tokens ({self.kv_cache_tokens})"
            )

    def _check_tensor_parallel(self) -> None:
        size = self.tensor_parallel_size
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"tensor_parallel_size must be a whole number >= 1, got {size!r}")
        for name in ("tp_timeout_s", "tp_start_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive seconds, got {getattr(self, name)!r}")
        if self.tensor_parallel_size > 1 and self.cuda_graphs == "on":
            raise ValueError(
                "padded steps (cuda_graphs='on') do not run under tensor parallelism yet; "
                "use cuda_graphs='auto' or 'off' with tensor_parallel_size > 1"
            )

    def to_dict(self) -> dict:
        """Plain JSON-ready fields (``from_dict`` reads them back)."""
        fields = asdict(self)
        fields["spec"] = self.spec.value
        return fields

    @classmethod
    def from_dict(cls, fields: dict) -> EngineConfig:
        return cls(**{**fields, "adaptive": AdaptiveConfig(**fields["adaptive"])})

    def uses_kv_regions(self, device_type: str) -> bool:
        """Whether the KV caches give each sequence slot a region of its own."""
        return switched_on(self.kv_regions, device_type == "cpu")

    def drafter_rows(self, drafter_block: int) -> int:
        """Cache rows a drafter needs beside the engine: the target's, plus room for every
        running request's block of ``drafter_block`` drafts (rounded up by a cache block)."""
        return self.kv_cache_tokens + self.max_num_seqs * (drafter_block + self.block_size)
