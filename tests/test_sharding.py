"""PopRT's manual sharding: the rule on captured graphs (table-driven), its errors, and sharded
models through trainingModel / inferenceModel against the eager PyTorch loop."""

from __future__ import annotations

import copy
import io
import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from in_process import run_module
from oracle import expected_output, train_reference
from torch import nn

import poptorch_sim as poptorch
from poptorch_sim.cli.shard import main as shard_main
from poptorch_sim.compiler.sharding import ShardingConfig, ShardingError, assign
from poptorch_sim.compiler.tracer import trace_model

REPO = Path(__file__).resolve().parent.parent


class Worked(nn.Module):
    """PopRT's worked example in fx terms: a shared ancestor, a side branch, leftovers."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.sin(x)  # sin: ancestor of every split point
        b = torch.cos(a)  # cos: split point 1
        c = torch.exp(a)  # exp: only split point 2 needs it
        d = b * c  # mul: split point 2
        e = torch.tanh(b)  # tanh: a side branch no split point reaches
        f = d + 1  # add: split point 3
        g = torch.sigmoid(f)  # sigmoid: after the last split point
        return g + e  # add_1


def _assignment(model: nn.Module, sharding, pipelining=None, *inputs) -> dict:
    trace = trace_model(model, inputs or (torch.randn(2, 3),), {})
    return assign(trace, ShardingConfig.from_info(sharding, pipelining)).by_name()


def test_poprt_worked_example_three_split_points_and_leftovers() -> None:
    # Given out of graph order: PopRT sorts the split points topologically first.
    got = _assignment(Worked(), {"add": 2, "cos": 0, "mul": 1}, {"add": 2, "cos": 0, "mul": 1})
    assert got == {
        "sin": (0, 0),  # claimed by 'cos', the first split point that reaches it
        "cos": (0, 0),
        "exp": (1, 1),  # 'mul' walks up to exp, stops at sin (already assigned)
        "mul": (1, 1),
        "tanh": (3, 3),  # side branch: leftover (largest device + 1, largest stage + 1)
        "add": (2, 2),
        "sigmoid": (3, 3),
        "add_1": (3, 3),
    }


def test_earlier_split_points_claim_shared_ancestors_whatever_their_device() -> None:
    got = _assignment(Worked(), {"cos": 3, "mul": 0}, {"cos": 0, "mul": 1})
    assert (got["sin"], got["exp"], got["add"]) == ((3, 0), (0, 1), (4, 2))


def test_without_pipelining_info_a_split_points_stage_is_its_rank_in_graph_order() -> None:
    got = _assignment(Worked(), {"mul": 0, "cos": 1})
    assert (got["cos"], got["mul"], got["sigmoid"]) == ((1, 0), (0, 1), (2, 2))


def test_a_split_point_on_the_last_op_leaves_no_leftover_device() -> None:
    got = _assignment(Worked(), {"cos": 0, "add_1": 1}, {"cos": 0, "add_1": 1})
    assert set(got.values()) == {(0, 0), (1, 1)}


class Chunked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 6)
        self.head = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = torch.chunk(self.fc(x), 2, dim=1)
        return self.head(torch.relu(a) + torch.sigmoid(b))


def test_an_item_of_a_tuple_result_goes_with_the_op_that_made_the_tuple() -> None:
    got = _assignment(Chunked(), {"relu": 0, "sigmoid": 1}, None, torch.randn(2, 4))
    assert got["chunk"] == got["getitem"] == got["getitem_1"] == (0, 0)
    assert (got["sigmoid"], got["add"], got["head"]) == ((1, 1), (2, 2), (2, 2))


def test_poprt_resnet50_cut_points_in_fx_names() -> None:
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet50()
    sharder = poptorch.Sharder(
        {"add": 0, "layer4_0_bn3": 1, "add_13": 2}, {"add": 0, "layer4_0_bn3": 1, "add_13": 2}
    )
    assert sharder.run(model, torch.randn(1, 3, 64, 64)) is model
    got = sharder.assignment
    assert got["conv1"] == got["layer1_0_downsample_1"] == got["add"] == (0, 0)
    assert got["layer1_0_relu_2"] == got["layer4_0_conv3"] == got["layer4_0_bn3"] == (1, 1)
    # the downsample branch of layer4's first block feeds only add_13
    assert got["layer4_0_downsample_0"] == got["add_13"] == (2, 2)
    assert got["layer4_0_relu_2"] == got["fc"] == (3, 3)
    assert len(got) == 175  # every op; the input and output nodes are not ops


# -- errors ------------------------------------------------------------------------------------


def test_unknown_node_names_the_closest_existing_names() -> None:
    with pytest.raises(ShardingError, match=r"^Sharder: unknown node 'add2' \(closest names: add"):
        _assignment(Worked(), {"add2": 0})


def test_a_split_point_must_be_an_op() -> None:
    with pytest.raises(ShardingError, match="node 'x' is an input of the graph, not an op"):
        _assignment(Worked(), {"x": 0})


def test_duplicate_node_in_yaml(tmp_path: Path) -> None:
    path = tmp_path / "shard.yaml"
    path.write_text("- {node: cos, device: 0, stage: 0}\n- {node: cos, device: 1, stage: 1}\n")
    with pytest.raises(ShardingError, match=r"duplicate node 'cos' \(entries 0 and 1\)"):
        poptorch.Options().setManualShardingConfig(str(path))


def test_stage_order_that_sends_activations_backwards() -> None:
    with pytest.raises(
        ShardingError,
        match=r"^Sharder: the stage order sends activations backwards: node 'exp' \(claimed by split point 'mul', stage 0\)"
        r" uses 'sin' \(split point 'cos', stage 1\).* in graph order are: cos \(stage 1\), "
        r"mul \(stage 0\)",
    ):
        _assignment(Worked(), {"mul": 1, "cos": 0}, {"mul": 0, "cos": 1})


def test_a_stage_on_two_devices() -> None:
    with pytest.raises(ShardingError, match="stage 0 is given two devices: 'cos' on device 0"):
        _assignment(Worked(), {"cos": 0, "mul": 1}, {"cos": 0, "mul": 0})


def test_device_count_over_the_reserved_ipus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POPTORCH_SIM_NUM_IPUS", "2")
    sharder = poptorch.Sharder({"cos": 0, "mul": 1})
    with pytest.raises(
        ShardingError,
        match=r"device count is over the reserved IPUs: .* 3 IPUs are needed, but 2 are "
        r"reserved .*device 2 holds the 4 op\(s\) no split point claims \(tanh, add, sigmoid, "
        r"add_1\): put the last split point on the graph's last op \('add_1'\)",
    ):
        sharder.run(Worked(), torch.randn(2, 3))


def test_replicas_count_against_the_reserved_ipus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POPTORCH_SIM_NUM_IPUS", "4")
    model = poptorch.Sharder({"cos": 0, "add_1": 1}).run(Worked(), torch.randn(2, 3))
    opts = poptorch.Options().replicationFactor(4).deviceIterations(2)
    with pytest.raises(ShardingError, match=r"2 IPUs × 4 replicas = 8 are needed, but 4"):
        poptorch.inferenceModel(model, opts)(torch.randn(16, 3))


@pytest.mark.parametrize(
    ("sharding", "pipelining", "message"),
    [
        ({}, None, "sharding_info must be a non-empty dict"),
        ({"cos": -1}, None, "device of split point 'cos' must be a non-negative integer"),
        ({"cos": 0}, {"cos": "0"}, "stage of split point 'cos' must be a non-negative integer"),
        ({"cos": 0, "mul": 1}, {"cos": 0}, r"without a stage: \['mul'\]"),
    ],
    ids=["empty", "negative-device", "string-stage", "missing-stage"],
)
def test_bad_sharder_arguments(sharding: dict, pipelining: dict | None, message: str) -> None:
    with pytest.raises(ShardingError, match=message):
        poptorch.Sharder(sharding, pipelining)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("node: cos\ndevice: 0\n", "is a non-empty list of mappings with keys node, device"),
        ("- {node: cos}\n", "entry 0 is .* each entry needs 'node' and 'device'"),
        ("- {node: cos, device: 0, ipu: 1}\n", r"unknown keys \['ipu'\]"),
        ("- {node: cos, device: 0, stage: 0}\n- {node: mul, device: 1}\n", "some entries have"),
        ("- [unclosed\n", "is not YAML"),
    ],
    ids=["mapping", "no-device", "unknown-key", "some-stages", "not-yaml"],
)
def test_bad_yaml(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "shard.yaml"
    path.write_text(text)
    with pytest.raises(ShardingError, match=message):
        poptorch.Options().setManualShardingConfig(path)


def test_a_model_is_cut_by_blocks_or_by_split_points_not_both() -> None:
    model = Worked()
    poptorch.BeginBlock(model, "B0", ipu_id=0)
    with pytest.raises(ShardingError, match="has block annotations .* and manual sharding"):
        poptorch.Sharder({"cos": 0}).run(model, torch.randn(2, 3))


def test_phased_execution_is_refused() -> None:
    model = poptorch.Sharder({"cos": 0, "add_1": 1}).run(Worked(), torch.randn(2, 3))
    opts = poptorch.Options().setExecutionStrategy(poptorch.SerialPhasedExecution("0", "1"))
    with pytest.raises(ShardingError, match="not SerialPhasedExecution"):
        poptorch.inferenceModel(model, opts)(torch.randn(2, 3))


# -- list_nodes --------------------------------------------------------------------------------


def test_list_nodes_prints_unique_names_with_op_shape_and_source_line() -> None:
    out = io.StringIO()
    infos = poptorch.list_nodes(Chunked(), torch.randn(5, 4), file=out)
    names = [i.name for i in infos]
    assert names == ["fc", "chunk", "getitem", "getitem_1", "relu", "sigmoid", "add", "head"]
    by_name = {i.name: i for i in infos}
    assert by_name["fc"].op == "Linear" and by_name["fc"].shape == "5x6"
    assert by_name["chunk"].op == "torch.chunk" and by_name["chunk"].shape == "(5x3, 5x3)"
    assert by_name["add"].op == "operator.add" and by_name["head"].shape == "5x2"
    assert "test_sharding.py" in by_name["relu"].location
    assert "torch.relu(a) + torch.sigmoid(b)" in by_name["relu"].location
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["name", "op", "shape", "source"]
    assert [line.split()[0] for line in lines[1:]] == names


# -- against eager -----------------------------------------------------------------------------


class Skippy(nn.Module):
    """A skip connection that crosses every stage, and a side branch that becomes a leftover."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(6, 8)
        self.skip = nn.Linear(8, 4)
        self.mid = nn.Linear(8, 8)
        self.mid2 = nn.Linear(8, 8)
        self.head = nn.Linear(12, 3)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        h = torch.relu(self.stem(x))
        skip = self.skip(h)
        h = torch.tanh(self.mid(h))
        h = self.mid2(h) + h
        out = self.head(torch.cat([h, skip], dim=1))
        return out, self.loss(out, y)


SKIPPY_SPLITS = {"relu": 0, "tanh": 1, "add": 2}  # leftovers (skip, cat, head, loss) on IPU 3


def _strategy(name: str):
    return poptorch.PipelinedExecution() if name == "pipelined" else poptorch.ShardedExecution()


def _reference_grads(model: nn.Module, x, y, ga: int) -> dict[str, torch.Tensor]:
    model.zero_grad()
    for xs, ys in zip(x.chunk(ga), y.chunk(ga)):
        (model(xs, ys)[1] / ga).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("strategy", ["pipelined", "sharded"])
def test_sharded_training_matches_eager(strategy: str) -> None:
    model = Skippy()
    x, y = torch.randn(2, 6), torch.randint(0, 3, (2,))
    poptorch.Sharder(SKIPPY_SPLITS, SKIPPY_SPLITS).run(model, x, y)
    reference, before = copy.deepcopy(model), copy.deepcopy(model)
    di, ga, lr = 2, 8, 0.5
    opts = poptorch.Options().deviceIterations(di).setExecutionStrategy(_strategy(strategy))
    opts.Training.gradientAccumulation(ga)
    opts.outputMode(poptorch.OutputMode.All)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=lr))
    n = 2 * di * ga
    x, y = torch.randn(n, 6), torch.randint(0, 3, (n,))
    out, loss = training(x, y)
    program = training._executable.program.program
    assert [(s.index, s.ipu) for s in program.stages] == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert program.stages[3].blocks == ("<leftover>",)
    assert program.meta["sharding"]["skip"] == (3, 3)
    assert program.sharded == (strategy == "sharded")
    # gradients of the first step: SGD without momentum moves each weight by lr × gradient
    grads = _reference_grads(copy.deepcopy(before), x[: n // di], y[: n // di], ga)
    outs = train_reference(
        reference, torch.optim.SGD(reference.parameters(), lr=lr), (x, y), di, ga, 1
    )
    all_mode = poptorch.OutputMode.All
    torch.testing.assert_close(out, expected_output(outs, all_mode, 1, lambda o: o[0]))
    torch.testing.assert_close(loss, expected_output(outs, all_mode, 1, lambda o: o[1]))
    for name, param in reference.named_parameters():
        torch.testing.assert_close(model.get_parameter(name), param, msg=name)
    training.destroy()

    one_step = copy.deepcopy(before)
    opts1 = poptorch.Options().setExecutionStrategy(_strategy(strategy))
    opts1.Training.gradientAccumulation(ga)
    stepper = poptorch.trainingModel(
        one_step, opts1, torch.optim.SGD(one_step.parameters(), lr=lr)
    )
    stepper(x[: n // di], y[: n // di])
    for name, param in before.named_parameters():
        moved = (param - one_step.get_parameter(name)) / lr
        torch.testing.assert_close(moved, grads[name], msg=name)
    stepper.destroy()


@pytest.mark.parametrize("strategy", ["pipelined", "sharded"])
def test_sharded_inference_matches_eager(strategy: str) -> None:
    model = Chunked()
    x = torch.randn(2, 4)
    poptorch.Sharder({"relu": 0, "sigmoid": 1}).run(model, x)
    opts = poptorch.Options().deviceIterations(4).setExecutionStrategy(_strategy(strategy))
    opts.autoRoundNumIPUs(True)
    inference = poptorch.inferenceModel(model, opts)
    x = torch.randn(12, 4)
    torch.testing.assert_close(inference(x), model(x))
    program = inference._executable.program.program
    assert [s.ipu for s in program.stages] == [0, 1, 2]
    inference.destroy()


def test_options_yaml_config_matches_eager(tmp_path: Path) -> None:
    path = tmp_path / "shard.yaml"
    entries = [{"node": n, "device": d, "stage": d} for n, d in SKIPPY_SPLITS.items()]
    path.write_text(yaml.safe_dump(entries))
    model = Skippy()
    reference = copy.deepcopy(model)
    opts = poptorch.Options().setManualShardingConfig(str(path))
    opts.Training.gradientAccumulation(7)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = torch.randn(14, 6), torch.randint(0, 3, (14,))
    _, loss = training(x, y)
    program = training._executable.program.program
    assert program.meta["sharding_source"] == str(path)
    assert len(program.stages) == 4 and program.meta["pipeline_stages"] == 7
    outs = train_reference(
        reference, torch.optim.SGD(reference.parameters(), lr=0.1), (x, y), 1, 7, 1
    )
    torch.testing.assert_close(loss, outs[0][6][0][1])
    for name, param in reference.named_parameters():
        torch.testing.assert_close(model.get_parameter(name), param, msg=name)
    training.destroy()


def test_the_sharder_annotation_wins_over_options(tmp_path: Path) -> None:
    model = poptorch.Sharder({"tanh": 0, "add": 1}).run(
        Skippy(), torch.randn(2, 6), torch.zeros(2).long()
    )
    opts = poptorch.Options().setManualShardingConfig([{"node": "relu", "device": 0}])
    opts.deviceIterations(3).autoRoundNumIPUs(True)
    inference = poptorch.inferenceModel(model, opts)
    inference(torch.randn(6, 6), torch.zeros(6).long())
    assert inference._executable.program.program.meta["sharding_source"] == "Sharder"
    inference.destroy()


def test_the_shard_command_runs_a_script_with_the_yaml_applied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "shard.yaml").write_text(
        "- {node: cos, device: 0, stage: 0}\n- {node: mul, device: 1, stage: 1}\n"
        "- {node: add_1, device: 2, stage: 2}\n"
    )
    script = tmp_path / "script.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys, torch
            sys.path.insert(0, {str(REPO / "tests")!r})
            import poptorch
            from test_sharding import Worked
            opts = poptorch.Options().deviceIterations(int(sys.argv[1])).autoRoundNumIPUs(True)
            model = poptorch.inferenceModel(Worked(), opts)
            x = torch.randn(6, 3)
            torch.testing.assert_close(model(x), Worked()(x))
            print([s.ipu for s in model._executable.program.program.stages])
            model.destroy()
            """
        )
    )
    # In this process (main() sets the variable, argv and path: monkeypatch restores them).
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("POPTORCH_SIM_SHARDING_CONFIG", "unset")
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert shard_main(["--config", "shard.yaml", "script.py", "3"]) == 0
    out = capfd.readouterr().out
    assert "3 split points from shard.yaml" in out
    assert out.strip().splitlines()[-1] == "[0, 1, 2]"
    assert os.environ["POPTORCH_SIM_SHARDING_CONFIG"] == str(tmp_path / "shard.yaml")
    # As a command: ``python -m poptorch_sim.shard``, here with a bad config (run in this
    # process: tests/in_process.py).
    (tmp_path / "bad.yaml").write_text("- {node: cos, device: 0}\n- {node: cos, device: 1}\n")
    status, _, err = run_module(
        "poptorch_sim.shard", "--config", "bad.yaml", "--check", capfd=capfd,
        monkeypatch=monkeypatch,
    )  # fmt: skip
    assert status == 2 and "duplicate node 'cos'" in err


class InPlace(nn.Module):
    """A cut right before ``nn.ReLU(inplace=True)``, as PopRT's ResNet-50 cut points make."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 8)
        self.relu = nn.ReLU(inplace=True)
        self.fc3 = nn.Linear(8, 2)
        self.loss = nn.MSELoss()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.fc1(x) + self.fc2(torch.tanh(self.fc1(x)))
        out = self.fc3(self.relu(h))
        return out, self.loss(out, y)


def test_a_stage_that_writes_into_its_input_in_place_matches_eager() -> None:
    model = InPlace()
    x, y = torch.randn(2, 4), torch.randn(2, 2)
    poptorch.Sharder({"add": 0}, {"add": 0}).run(model, x, y)
    reference = copy.deepcopy(model)
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(3)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = torch.randn(6, 4), torch.randn(6, 2)
    _, loss = training(x, y)
    program = training._executable.program.program
    assert "clone" in program.stages[1].module.code
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    outs = train_reference(reference, ref_opt, (x, y), 1, 3, 1)
    torch.testing.assert_close(loss, outs[0][2][0][1])
    for name, param in reference.named_parameters():
        torch.testing.assert_close(model.get_parameter(name), param, msg=name)
    training.destroy()


# -- on graphs captured by torch.export (models torch.fx cannot trace) --------------------------


def _small_bert():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=16, num_labels=3,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    return transformers.BertForSequenceClassification(config)


# embeddings | encoder layer 0 | encoder layer 1 | leftovers: pooler, classifier, loss
BERT_SPLITS = {"dropout": 0, "layer_norm_2": 1, "layer_norm_4": 2}


def test_list_nodes_names_the_exported_ops_of_a_transformers_bert() -> None:
    model = _small_bert()
    ids, labels = torch.randint(0, 64, (2, 8)), torch.randint(0, 3, (2,))
    infos = poptorch.list_nodes(model, input_ids=ids, labels=labels, file=io.StringIO())
    by_name = {i.name: i for i in infos}
    assert by_name["layer_norm_2"].op == "aten.layer_norm.default"
    assert by_name["layer_norm_2"].shape == "2x8x16"
    assert "modeling_bert.py" in by_name["layer_norm_2"].location
    assert by_name["cross_entropy_loss"].shape == "scalar"


@pytest.mark.parametrize("strategy", ["pipelined", "sharded"])
def test_sharded_transformers_bert_trains_like_eager(strategy: str) -> None:
    model = _small_bert()
    ids, labels = torch.randint(0, 64, (2, 8)), torch.randint(0, 3, (2,))
    sharder = poptorch.Sharder(BERT_SPLITS, BERT_SPLITS)
    sharder.run(model, input_ids=ids, labels=labels)
    assert sharder.assignment["linear_12"] == (3, 3)  # the pooler: after the last split point
    reference = copy.deepcopy(model)
    ga = 7
    opts = poptorch.Options().setExecutionStrategy(_strategy(strategy))
    opts.Training.gradientAccumulation(ga)
    opts.outputMode(poptorch.OutputMode.All)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    ids, labels = torch.randint(0, 64, (2 * ga, 8)), torch.randint(0, 3, (2 * ga,))
    out = training(input_ids=ids, labels=labels)
    program = training._executable.program.program
    assert [(s.ipu, s.blocks) for s in program.stages] == [
        (0, ("dropout",)),
        (1, ("layer_norm_2",)),
        (2, ("layer_norm_4",)),
        (3, ("<leftover>",)),
    ]
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    ref_opt.zero_grad()
    losses, logits = [], []
    for x, y in zip(ids.chunk(ga), labels.chunk(ga)):
        result = reference(input_ids=x, labels=y)
        (result.loss / ga).backward()
        losses.append(result.loss.detach())
        logits.append(result.logits.detach())
    ref_opt.step()
    torch.testing.assert_close(out.loss, torch.stack(losses))
    torch.testing.assert_close(out.logits, torch.cat(logits))
    for name, param in reference.named_parameters():
        torch.testing.assert_close(model.get_parameter(name), param, msg=name)
    training.destroy()
