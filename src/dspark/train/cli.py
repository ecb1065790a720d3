"""``dspark train-drafter``: a DSpark drafter trained by self-distillation.

--data DIR reuses the splits found there (``train.npz`` from ``dspark distill``, and the
held-out ``calib.npz`` and ``eval.npz``); a missing split is generated first (the target
answers ShareGPT first turns greedily; see ``dspark.datasets.sharegpt_split``) and saved
there (default OUT/data/). Then it trains, evaluating the held-out greedy acceptance length
every --eval-every steps, and writes OUT/drafter.safetensors, OUT/drafter.json,
OUT/history.json and OUT/training.png (τ against tokens seen). The training state is
saved under OUT/checkpoint/ every --checkpoint-every steps and when it stops;
``dspark train-drafter --resume OUT`` continues exactly where it stopped (the settings
come from the checkpoint; --max-minutes may be given anew). --no-heads trains the DFlash
ablation (same backbone, no Markov or confidence head). --init DIR starts from a saved
drafter's weights and shape instead of random ones (its calibration is dropped: calibrate
the result anew).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from dspark.figures import save_figure
from dspark.models.drafter import (
    DrafterConfig,
    DraftModel,
    count_parameters,
    load_drafter,
    save_drafter,
)
from dspark.models.loader import load_model, resolve_dtype
from dspark.train.data import DistillSet, generate_greedy, load_prompts, sharegpt_prompts
from dspark.train.trainer import TrainConfig, config_dict, init_drafter, load_checkpoint, train

SPLIT_FILES = {"train": "train.npz", "calib": "calib.npz", "eval": "eval.npz"}


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=None, help="directory for the drafter and its data")
    parser.add_argument(
        "--resume", default=None, metavar="OUT", help="continue the run that writes to OUT"
    )
    parser.add_argument("--model", default=None, help="target (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None)
    data = parser.add_argument_group("data")
    data.add_argument(
        "--data", default=None, help="data directory: reused if it has the splits, else filled"
    )
    data.add_argument(
        "--prompts", default=None, help="tokenised prompt splits (python -m dspark.train.data)"
    )
    data.add_argument("--num-prompts", type=int, default=4000, help="training prompts")
    data.add_argument("--heldout-prompts", type=int, default=400, help="per held-out split")
    data.add_argument("--max-prompt-tokens", type=int, default=256)
    data.add_argument("--max-new-tokens", type=int, default=256)
    data.add_argument("--gen-batch", type=int, default=256)
    shape = parser.add_argument_group("drafter")
    shape.add_argument("--layers", type=int, default=2, help="draft decoder layers")
    shape.add_argument("--intermediate", type=int, default=1024, help="draft MLP width")
    shape.add_argument("--k", type=int, default=7, help="block size (drafts per pass)")
    shape.add_argument("--markov-rank", type=int, default=256)
    shape.add_argument(
        "--no-heads", action="store_true", help="DFlash ablation: no Markov/confidence head"
    )
    shape.add_argument(
        "--capture-layers", default=None, help="comma-separated target layers (default: 5 spread)"
    )
    shape.add_argument(
        "--init",
        default=None,
        metavar="DRAFTER",
        help="start from this drafter ('shipped': the packaged one); its shape wins over "
        "--layers, --intermediate, --k, --markov-rank, --no-heads and --capture-layers",
    )
    opt = parser.add_argument_group("optimisation")
    defaults = TrainConfig()
    opt.add_argument("--steps", type=int, default=defaults.steps)
    opt.add_argument("--batch-size", type=int, default=defaults.batch_size)
    opt.add_argument("--anchors", type=int, default=defaults.anchors)
    opt.add_argument("--max-length", type=int, default=defaults.max_length)
    opt.add_argument("--lr", type=float, default=defaults.lr)
    opt.add_argument("--warmup", type=int, default=defaults.warmup)
    opt.add_argument("--eval-every", type=int, default=defaults.eval_every)
    opt.add_argument("--max-minutes", type=float, default=None, help="this run's limit")
    opt.add_argument("--checkpoint-every", type=int, default=500, help="steps")
    opt.add_argument(
        "--loss", choices=["tv", "kl"], default=defaults.loss, help="the distribution term"
    )
    opt.add_argument("--seed", type=int, default=0)


def build_data(loaded, args: argparse.Namespace, directory: Path) -> dict[str, DistillSet]:
    """Generate (or reuse) the three splits under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    held_out = args.heldout_prompts
    counts = {"train": args.num_prompts, "calib": held_out, "eval": held_out}
    given = load_prompts(args.prompts) if args.prompts else {}
    sets = {}
    for split, file in SPLIT_FILES.items():
        path = directory / file
        if path.is_file():
            sets[split] = DistillSet.load(path)
            continue
        if split in given:
            prompts = [p for p in given[split] if len(p) <= args.max_prompt_tokens][: counts[split]]
        else:
            prompts = sharegpt_prompts(
                loaded.tokenizer, split, args.max_prompt_tokens, counts[split]
            )
        start = time.perf_counter()
        answers = generate_greedy(
            loaded.model,
            prompts,
            args.max_new_tokens,
            loaded.stop_token_ids,
            batch_size=args.gen_batch,
            progress=True,
        )
        sets[split] = DistillSet.build(prompts, answers)
        sets[split].save(path)
        print(
            f"[dspark] {split}: {len(sets[split])} sequences, "
            f"{sets[split].num_answer_tokens} answer tokens in {time.perf_counter() - start:.0f} s"
        )
    return sets


def plot_history(
    histories: dict[str, list[dict]],
    path: Path,
    tau_label: str = "held-out greedy τ (engine rounds)",
) -> None:
    """Training loss against steps and held-out greedy τ against tokens seen, one line
    per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, history in histories.items():
        steps = [h["step"] for h in history]
        losses = [h["loss"] for h in history]
        window = max(1, len(losses) // 50)
        smooth = [
            sum(losses[max(0, i - window) : i + 1]) / len(losses[max(0, i - window) : i + 1])
            for i in range(len(losses))
        ]
        left.plot(steps, smooth, label=name)
        evals = [(h.get("tokens", 0) / 1e6, h["eval"]["tau"]) for h in history if "eval" in h]
        if evals:
            right.plot(*zip(*evals, strict=True), marker="o", label=name)
    left.set_xlabel("step")
    left.set_ylabel("training loss (moving average)")
    right.set_xlabel("training tokens seen (millions)")
    right.set_ylabel(tau_label)
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


ARGS_FILE = "args.json"


def start_from(directory: str, loaded, device: str) -> DraftModel:
    """A saved drafter to train further: fp32 weights, its calibration dropped (training
    moves the confidence logits it was fitted to)."""
    if directory == "shipped":
        from dspark.engine.shipped import find_drafter

        directory = str(find_drafter(loaded.config, required=True))
    drafter = load_drafter(directory, loaded.model, device=device, dtype=torch.float32)
    drafter.config = replace(drafter.config, calibration=(), calibration_bias=())
    return drafter.train().requires_grad_(True)


def resumed_args(args: argparse.Namespace) -> argparse.Namespace:
    """The settings of the run ``--resume`` names, with this call's --max-minutes."""
    saved = Path(args.resume) / "checkpoint" / ARGS_FILE
    if not saved.is_file():
        raise SystemExit(f"no training state under {args.resume} (looked for {saved})")
    merged = argparse.Namespace(**json.loads(saved.read_text()))
    merged.out, merged.resume, merged.handler = args.resume, args.resume, args.handler
    if args.max_minutes is not None:
        merged.max_minutes = args.max_minutes
    return merged


def main(args: argparse.Namespace) -> None:
    if args.resume:
        args = resumed_args(args)
    elif args.out is None:
        raise SystemExit("give --out DIR (or --resume DIR)")
    out = Path(args.out)
    dtype = resolve_dtype(args.dtype, args.device)
    loaded = load_model(args.model, dtype=dtype, device=args.device)
    data_dir = Path(args.data) if args.data else out / "data"
    sets = build_data(loaded, args, data_dir)
    overrides = dict(
        num_layers=args.layers,
        intermediate_size=args.intermediate,
        block_size=args.k,
        markov_rank=0 if args.no_heads else args.markov_rank,
        confidence_head=not args.no_heads,
    )
    if args.capture_layers:
        overrides["capture_layers"] = tuple(int(x) for x in args.capture_layers.split(","))
    init = getattr(args, "init", None)  # absent from checkpoints written before --init
    if init:
        drafter = start_from(init, loaded, args.device)
        drafter_config = drafter.config
    else:
        drafter_config = DrafterConfig.for_target(loaded.config, **overrides)
        drafter = DraftModel(drafter_config).to(args.device)
        init_drafter(drafter, args.seed)
        drafter.attach(loaded.model)
    print(
        f"[dspark] drafter: {count_parameters(drafter) / 1e6:.2f} M parameters "
        f"({count_parameters(drafter) * 2 / 2**20:.1f} MiB in bf16), layers "
        f"{drafter_config.capture_layers} of the target as context"
    )
    config = TrainConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        anchors=args.anchors,
        max_length=args.max_length,
        lr=args.lr,
        warmup=min(args.warmup, max(1, args.steps // 10)),
        eval_every=args.eval_every,
        seed=args.seed,
        max_minutes=args.max_minutes,
        loss=args.loss,
    )
    checkpoints = out / "checkpoint"
    state = load_checkpoint(checkpoints) if args.resume else None
    if args.resume and state is None:
        raise SystemExit(f"no training state under {checkpoints}")
    checkpoints.mkdir(parents=True, exist_ok=True)
    saved = {k: v for k, v in vars(args).items() if k not in ("handler", "resume")}
    (checkpoints / ARGS_FILE).write_text(json.dumps(saved))
    start = time.perf_counter()
    history = train(
        loaded.model,
        drafter,
        sets["train"],
        sets["eval"],
        config,
        checkpoint_dir=checkpoints,
        checkpoint_every=args.checkpoint_every,
        resume=state,
    )
    minutes = (time.perf_counter() - start) / 60 + (state or {}).get("minutes", 0.0)
    evals = [h["eval"] for h in history if "eval" in h]
    metadata = {
        "kind": "dflash-ablation" if not drafter_config.confidence_head else "dspark",
        "init": str(init) if init else None,
        "target": str(loaded.path.name),
        "train": config_dict(config),
        "steps_done": len(history),
        "tokens_seen": history[-1]["tokens"] if history else 0,
        "train_minutes": round(minutes, 2),
        "device": str(torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"),
        "data": {
            s: {"sequences": len(d), "answer_tokens": d.num_answer_tokens} for s, d in sets.items()
        },
        "final_eval": evals[-1] if evals else None,
    }
    save_drafter(drafter, out, metadata)
    (out / "history.json").write_text(json.dumps(history))
    plot_history({metadata["kind"]: history}, out / "training.png")
    print(f"[dspark] saved {out} after {len(history)} steps ({minutes:.1f} min)")
