"""The model-garden applications the compatibility run knows: where each lives in a checkout of
Graphcore's examples, which tests it runs (all of them), and its generated/synthetic-data
training commands on tiny configurations (the flags each app documents, sizes turned down)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["App", "APPS", "NOT_ATTEMPTED", "SKIPPED_REQUIREMENTS", "Train"]

# Requirement lines never installed into an app's environment: the project's own torch stack
# (the environment sees the project's torch through a .pth file) and the test runner.
SKIPPED_REQUIREMENTS = (
    "torch",
    "torchvision",
    "torchaudio",
    "poptorch",
    "popxl",
    "popxl-addons",
    "pytest",
    "pytest-forked",
    "pytest-xdist",
    "pytest-pythonpath",
    "--find-links",
)

# Requirements not attempted, with the reason shown in the table: they build native code
# against the installed torch or MPI (minutes of CPU each) and serve multi-host runs only.
NOT_ATTEMPTED = {
    "horovod": "builds from source against torch: a CUDA torch needs the CUDA toolkit",
    "mpi4py": "needs an MPI installation (multi-host runs only)",
}


# wandb 0.12 uses ``np.float_`` (gone in numpy 2) and ``pkg_resources``; every app pins it; 0.17.9
# imports beside numpy 2 and the apps' protobuf 3.19.
COMMON_PINS = {"wandb": "0.17.9"}
# tokenizers < 0.13 has no Python 3.11 wheel and builds only with crates.io reachable;
# transformers 4.23.1 is the release nearest to the apps' 4.18.0 that takes tokenizers 0.13.
TRANSFORMERS_4_18 = {"transformers": "4.23.1", "tokenizers": "0.13.3"}


@dataclass(frozen=True)
class Train:
    """One training command.

    Attributes:
        argv: the command (run from the app's folder with the environment's python).
        steps: for an app with no flag that bounds its steps, a regular expression of the line
            it logs per step, and ``steps_wanted`` how many such lines make a pass: the runner
            then stops the run itself (``None``: the command ends by itself).
        steps_wanted: see ``steps``.
    """

    argv: tuple[str, ...]
    steps: str | None = None
    steps_wanted: int = 2


@dataclass(frozen=True)
class App:
    """One application.

    Attributes:
        key: a short name for the table.
        path: its folder inside the examples checkout.
        tests: pytest arguments (run from ``path``); empty: no test step.
        train: the training commands.
        pins: requirement overrides, ``{name: version}`` ("" for the newest), where the app's
            pin does not install on Python 3.11 or does not import beside the project's numpy 2.
        env: extra environment variables.
    """

    key: str
    path: str
    tests: tuple[str, ...]
    train: tuple[Train, ...]
    pins: dict[str, str] = field(default_factory=lambda: dict(COMMON_PINS))
    env: dict[str, str] = field(default_factory=dict)


APPS: dict[str, App] = {
    "cnns": App(
        key="cnns",
        path="vision/cnns/pytorch",
        # Its conftest downloads CIFAR-10 and sample images when the test run starts, which
        # stops the whole run offline: without it each test that needs the data fails alone.
        tests=("tests", "--noconftest"),
        train=tuple(
            Train(
                (
                    "train/train.py",
                    *f"--data {data} --model resnet18 --epoch 1 --precision 32.32 --iterations 2 "
                    "--validation-mode none --optimizer sgd_combined --lr 0.001 "
                    "--gradient-accumulation 2 --micro-batch-size 1 --dataloader-worker 1 "
                    "--seed 0".split(),
                )
            )
            for data in ("synthetic", "generated")
        ),
    ),
    "bert": App(
        key="bert",
        path="nlp/bert/pytorch",
        tests=("tests",),
        train=(
            Train(
                (
                    "run_pretraining.py",
                    *"--config unit_test --dataset generated --training-steps 2 "
                    "--custom-ops False --lr-schedule constant --disable-progress-bar".split(),
                )
            ),
        ),
        pins={**COMMON_PINS, **TRANSFORMERS_4_18, "scipy": ""},
    ),
    "gpt2": App(
        key="gpt2",
        path="nlp/gpt2/pytorch",
        tests=("tests",),
        train=(
            Train(
                (
                    "train_gpt2.py",
                    *"--model gpt2-test --max-len 32 --layers-per-ipu 2 2 --ipus-per-replica 2 "
                    "--matmul-proportion 0.2 0.2 --replication-factor 1 --epochs 1 "
                    "--batch-size 1 --gradient-accumulation 10 --device-iterations 1 "
                    "--dataset generated --training-steps 2 --num-workers 1 --custom-ops False "
                    "--enable-sequence-serialized False --embedding-serialization-factor 1".split(),
                )
            ),
        ),
        pins={**COMMON_PINS, "tokenizers": "0.13.3", "scipy": ""},
    ),
    "vit": App(
        key="vit",
        path="vision/vit/pytorch",
        tests=("test_vit.py",),
        train=(
            Train(
                (
                    "pretrain.py",
                    *"--config b16_in1k_pretrain --dataset generated --epochs 0 "
                    "--training-steps 2 --num-hidden-layers 2 --layers-per-ipu 1 1 "
                    "--ipus-per-replica 2 --matmul-proportion 0.3 0.3 --recompute-mid-layers 1 "
                    "--replication-factor 1 --gradient-accumulation 6 --micro-batch-size 1 "
                    "--device-iterations 1 --dataloader-workers 1 --mixup False "
                    "--rebatched-worker-size 2 --enable-rts False "
                    "--checkpoint-save-steps 100".split(),
                )
            ),
        ),
        pins={**COMMON_PINS, **TRANSFORMERS_4_18},
    ),
    "clip": App(
        key="clip",
        path="multimodal/CLIP/pytorch",
        tests=("tests",),
        train=(
            # 666 steps an epoch on its generated data, and no flag to bound them: the runner
            # stops it after two.
            Train(
                (
                    "train.py",
                    *"--config CLIP_ViT-B-32_cc3m --host_generate_data True --epochs 1 "
                    "--batch_size 1 --dataloader_workers 1 --async-dataloader False "
                    "--embed_dim 16 --transformer_width 16 --transformer_heads 2 "
                    "--vision_width 128 --vision_heads 2".split(),
                ),
                steps=r"Epoch: [\d.]+/\d+ Step: \d+/\d+ .* loss: ",
            ),
        ),
        pins={**COMMON_PINS, **TRANSFORMERS_4_18},
    ),
}
