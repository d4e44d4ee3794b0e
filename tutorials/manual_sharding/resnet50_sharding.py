"""Manual sharding: torchvision's ResNet-50 cut at named graph nodes, trained pipelined over IPUs.

PopRT's manual sharding names *split points*: graph nodes that end a stage. From each split
point PopRT walks back towards the inputs and places every op it reaches on that split point's
IPU and pipeline stage; whatever is left over (here: the ops after the last split point) goes
to one more IPU and stage. This program uses the three split points of PopRT's ResNet-50
example, written in this graph's names, so the network runs as four pipeline stages on four
(simulated) IPUs, and writes the execution profile with one timeline per IPU.

    python resnet50_sharding.py --list-nodes                # the names to choose from
    python resnet50_sharding.py                             # Sharder: a dict in the code
    python resnet50_sharding.py --config shard.yaml         # Options.setManualShardingConfig
    python -m poptorch_sim.shard --config shard.yaml resnet50_sharding.py --from-command

The data are generated (random images and labels): the point is where each op runs, not
accuracy.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch import nn
from torchvision.models.resnet import Bottleneck, ResNet

import poptorch

# PopRT's example (ONNX ResNet-50 v1-7) splits after resnetv17_stage1__plus0,
# resnetv17_stage4_batchnorm2_fwd and resnetv17_stage4__plus0. In torchvision's fx graph those
# are the residual add of layer1's first block, the third batch norm of layer4's first block,
# and that block's residual add (the 14th add of the network).
SPLIT_POINTS = {"add": 0, "layer4_0_bn3": 1, "add_13": 2}  # node name -> IPU, and stage


class ResNet50WithLoss(ResNet):
    """ResNet-50 that also returns its loss, with the node names of plain ``resnet50()``."""

    def __init__(self, num_classes: int) -> None:
        super().__init__(Bottleneck, [3, 4, 6, 3], num_classes=num_classes)
        self.criterion = nn.CrossEntropyLoss()

    def forward(self, images: torch.Tensor, labels: torch.Tensor):  # type: ignore[override]
        logits = super().forward(images)
        return logits, self.criterion(logits, labels)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--list-nodes", action="store_true", help="print the graph's node names and exit")
    add("--config", default=None, help="PopRT sharding YAML (Options.setManualShardingConfig)")
    add("--from-command", action="store_true", help="split points come from poptorch_sim.shard")
    add("--strategy", choices=["pipelined", "sharded"], default="pipelined")
    add("--batch-size", type=int, default=4, help="micro-batch size (default: 4)")
    add("--image-size", type=int, default=224, help="image height and width (default: 224)")
    add("--num-classes", type=int, default=1000, help="classes (default: 1000)")
    add("--gradient-accumulation", type=int, default=8, help="micro-batches per step (8)")
    add("--steps", type=int, default=2, help="optimizer steps (one call each; default: 2)")
    add("--profile-dir", default="./profile", help="where the profile goes (./profile)")
    return parser.parse_args(argv)


def shard(model: nn.Module, args: argparse.Namespace, example: tuple, opts: poptorch.Options):
    """Attach the split points the way the command line asked."""
    if args.from_command:
        return model  # python -m poptorch_sim.shard --config ... applies them to every model
    if args.config:
        opts.setManualShardingConfig(args.config)
        return model
    sharder = poptorch.Sharder(sharding_info=SPLIT_POINTS, pipelining_info=SPLIT_POINTS)
    sharder.run(model, *example)
    per_stage: dict[tuple[int, int], int] = {}
    for device_stage in sharder.assignment.values():
        per_stage[device_stage] = per_stage.get(device_stage, 0) + 1
    for (ipu, stage), count in sorted(per_stage.items(), key=lambda item: item[0][1]):
        print(f"stage {stage} on IPU {ipu}: {count} ops")
    return model


def per_ipu_timeline(trace_file: Path, width: int = 72) -> str:
    """Each IPU's forward (F) and backward (B) work over time, from the Chrome-trace JSON."""
    events = json.loads(trace_file.read_text())["traceEvents"]
    work = [e for e in events if e.get("ph") == "X" and e["cat"] in ("fwd", "bwd")]
    start = min(e["ts"] for e in work)
    span = max(e["ts"] + e["dur"] for e in work) - start
    rows: dict[int, list[str]] = {}
    busy: dict[int, float] = {}
    for e in work:
        row = rows.setdefault(e["tid"], ["."] * width)
        first = int((e["ts"] - start) / span * width)
        last = max(first + 1, round((e["ts"] + e["dur"] - start) / span * width))
        for col in range(first, min(last, width)):
            row[col] = "F" if e["cat"] == "fwd" else "B"
        busy[e["tid"]] = busy.get(e["tid"], 0.0) + e["dur"] / 1e3
    stages: dict[int, set[int]] = {}
    for e in work:
        stages.setdefault(e["tid"], set()).add(e["args"]["stage"])
    return "\n".join(
        f"IPU {ipu} |{''.join(rows[ipu])}| stage {','.join(map(str, sorted(stages[ipu])))}, "
        f"busy {busy[ipu]:.1f} ms"
        for ipu in sorted(rows)
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.manual_seed(0)
    model = ResNet50WithLoss(args.num_classes)
    mb = args.batch_size
    example = (
        torch.randn(mb, 3, args.image_size, args.image_size),
        torch.randint(0, args.num_classes, (mb,)),
    )
    if args.list_nodes:
        poptorch.list_nodes(model, *example)
        return

    opts = poptorch.Options().enableProfiling(args.profile_dir)
    opts.Training.gradientAccumulation(args.gradient_accumulation)
    strategy = poptorch.PipelinedExecution if args.strategy == "pipelined" else None
    opts.setExecutionStrategy(strategy() if strategy else poptorch.ShardedExecution())
    shard(model, args, example, opts)
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    training = poptorch.trainingModel(model, opts, optimizer=optimizer)

    combined = mb * args.gradient_accumulation
    for step in range(args.steps):
        images = torch.randn(combined, 3, args.image_size, args.image_size)
        labels = torch.randint(0, args.num_classes, (combined,))
        _, loss = training(images, labels)
        print(f"step {step}: loss {float(loss):.4f}")
    training.destroy()  # joins the IPU threads and writes the profile

    traces = Path(args.profile_dir).glob("execution_trace_training_*.json")
    latest = max(traces, key=lambda path: path.stat().st_mtime)
    print(f"Per-IPU timeline of {latest} (F forward, B backward):")
    print(per_ipu_timeline(latest))


if __name__ == "__main__":
    main()
