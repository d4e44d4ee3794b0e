"""The compatibility runners' own logic: the model garden's classifier and process runner, and
the second pass of PopTorch's test suite (its node ids, its patched copy, its plugin)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from xml.sax.saxutils import escape

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks" / "model_garden"))

import classify as garden_classify  # noqa: E402
import garden  # noqa: E402
import outcomes as garden_outcomes  # noqa: E402
import process as garden_process  # noqa: E402

from benchmarks.poptorch_tests import rules, second_pass  # noqa: E402

PROJECT = "/src/poptorch_sim_checkout"
APP = "/src/examples/multimodal/CLIP/pytorch"


def _classify(text: str, cwd: str | None = APP) -> str:
    return garden_classify.classify(text, PROJECT, cwd)


# -- the garden's classifier ------------------------------------------------------------------
def test_a_run_stopped_at_the_runners_limit_is_poptorch_sims() -> None:
    log = "Loading the data\n\n[model_garden] timed out after 1200 s\n"
    assert _classify(log) == "poptorch_sim"


def test_a_test_stopped_by_pytest_timeout_is_poptorch_sims() -> None:
    text = "Failed: Timeout >900.0s\n\ntests/cpu_ipu_test.py:40: in test_x\n    run()\n"
    assert _classify(text) == "poptorch_sim"


def test_a_missing_file_earlier_in_a_hung_log_is_no_reason() -> None:
    log = "FileNotFoundError: ./data/x.csv (ignored)\n...\n[model_garden] timed out after 60 s\n"
    assert _classify(log) == "poptorch_sim"


def test_a_download_that_stalled_is_the_environments() -> None:
    log = "urllib.error.URLError: <urlopen error>\n[model_garden] timed out after 60 s\n"
    assert _classify(log) == "environment"


def test_a_relative_frame_into_the_project_is_the_projects() -> None:
    # pytest prints frames relative to where it ran: here from the app's folder.
    text = (
        "RuntimeError: one of the variables needed for gradient computation has been modified\n"
        "model.py:120: in forward\n    x = self.attn(x)\n"
        "../../../../poptorch_sim_checkout/poptorch_sim/runtime/stage.py:88: in backward\n"
        "    loss.backward()\n"
    )
    assert _classify(text) == "poptorch_sim"
    assert _classify(text, cwd=None) == "poptorch_sim"


def test_an_absolute_frame_into_the_project_is_the_projects() -> None:
    text = f'File "{PROJECT}/poptorch_sim/executor/eager.py", line 3, in run\nValueError: x\n'
    assert _classify(text) == "poptorch_sim"


def test_an_ipu_against_cpu_mismatch_in_the_apps_assertion_is_poptorch_sims() -> None:
    # CLIP's tests/cpu_ipu_test.py: the assertion is the app's frame, the numbers are ours.
    text = (
        "    assert np.allclose(cpu_loss.numpy(), ipu_loss.numpy(), atol=1e-6)\n"
        "E   assert False\n"
        "E    +  where False = <function allclose at 0x7f>(array(2.84), array(3.07), atol=1e-06)\n"
        "tests/cpu_ipu_test.py:85: AssertionError\n"
    )
    assert _classify(text) == "poptorch_sim"


def test_cnns_sample_images_not_downloaded_are_the_environments() -> None:
    # datasets/dataset.py logs this and exits when data/images (get_images.sh) is empty.
    text = (
        "SystemExit: 1\ndatasets/dataset.py:68: in __init__\n    sys.exit(1)\n"
        "ERROR    root:dataset.py:67 No images found. Run get_images.sh script. Aborting...\n"
    )
    assert _classify(text) == "environment"


def test_a_test_whose_fixture_is_missing_is_named_and_is_the_environments(
    tmp_path: Path,
) -> None:
    # The fixture lives in a conftest that --noconftest switched off: pytest's report has no
    # crash line, only its "E" line.
    node = "tests/tritonserver/multi_client_test.py::test_single_model[resnet50-SYNC-1]"
    longrepr = (
        "file tests/tritonserver/multi_client_test.py, line 20\n"
        "  def test_single_model(request, triton_server, model_name):\n"
        "E       fixture 'triton_server' not found\n"
        ">       available fixtures: capfd, capsys, tmp_path\n\n"
        "tests/tritonserver/multi_client_test.py:20"
    )
    log = tmp_path / "cnns-tests.jsonl"
    log.write_text(_report(node, "setup", "failed", longrepr) + "\n")
    (case,) = garden_outcomes.read_report_log(log).cases
    assert case.message == "fixture 'triton_server' not found"
    assert _classify(case.text) == "environment"


def test_the_apps_own_frame_and_an_installed_package_keep_their_classes() -> None:
    app = "model.py:120: in forward\n    x = y\nTypeError: bad operand\n"
    assert _classify(app) == "app"
    installed = "../../venv/lib/python3.11/site-packages/attrdict/mapping.py:4: in <module>\n"
    assert _classify(installed + "ImportError: cannot import name 'Mapping'") == "environment"


def test_a_frame_of_another_poptorch_sim_checkout_is_not_this_projects() -> None:
    text = 'File "/elsewhere/poptorch_sim/x.py", line 3, in f\nValueError: x\n'
    assert _classify(text) == "app"


# -- the garden's process runner --------------------------------------------------------------
def test_the_runner_stops_a_command_once_it_has_logged_enough_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(garden_process, "POLL_S", 0.1)  # the log is read every 5 s otherwise
    script = "import time\nfor i in range(1000):\n    print(f'Step: {i}', flush=True)\n"
    script += "    time.sleep(0.05)\n"
    log = tmp_path / "train.log"
    rc = garden_process.run(
        [sys.executable, "-c", script], tmp_path, log, 600, {}, stop_after=(r"Step: \d+", 2)
    )
    assert rc == garden_process.STOPPED
    assert "stopped after 2 steps" in log.read_text()


def test_the_runner_marks_a_command_that_ran_out_of_time(tmp_path: Path) -> None:
    log = tmp_path / "hang.log"
    # Ctrl-C ends it even where the test runs with SIGINT ignored (a child inherits that, and
    # the runner would then wait out its 60 s grace before killing it).
    script = "import signal, time\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
    script += "print('Loading the data', flush=True)\ntime.sleep(600)\n"
    cmd = [sys.executable, "-c", script]
    rc = garden_process.run(cmd, tmp_path, log, 1, {})
    assert rc == garden_process.TIMED_OUT_RC
    assert garden_classify.classify(log.read_text(), PROJECT) == "poptorch_sim"


# -- the garden's reading of a suite's outcomes ---------------------------------------------
def _report(node: str, when: str, outcome: str, longrepr: object = None, printed: str = "") -> str:
    """One line of a pytest report log (pytest-reportlog's ``--report-log``), as pytest writes
    a phase's ``TestReport``."""
    sections = [["Captured stdout call", printed]] if printed else []
    data = {
        "nodeid": node,
        "location": [node.split("::")[0], 1, node.split("::")[-1]],
        "keywords": {},
        "outcome": outcome,
        "longrepr": longrepr,
        "when": when,
        "user_properties": [],
        "sections": sections,
        "duration": 0.1,
        "$report_type": "TestReport",
    }
    return json.dumps(data)


def _script_failed(frame: str) -> dict[str, object]:
    """A failure's ``longrepr`` as pytest serialises it: the app's test saw its script fail."""
    message = "subprocess.CalledProcessError: Command '['python', 'run.py']' returned 1."
    entry = {
        "lines": ["    out = subprocess.check_output(cmd)", "E   " + message],
        "reprfuncargs": None,
        "reprlocals": None,
        "reprfileloc": {"path": frame, "lineno": 23, "message": "CalledProcessError"},
        "style": "long",
    }
    return {
        "reprcrash": {"path": frame, "lineno": 23, "message": message},
        "reprtraceback": {
            "reprentries": [{"type": "ReprEntry", "data": entry}],
            "extraline": None,
            "style": "long",
        },
        "sections": [],
        "chain": None,
    }


_SIM_TRACEBACK = (
    "stderr=Traceback (most recent call last):\n"
    '  File "inference/run_benchmark.py", line 40, in <module>\n'
    f'  File "{PROJECT}/poptorch_sim/executor/inference.py", line 88, in __call__\n'
    "TypeError: unsupported option 'x'\n"
)
_DATA_TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "datasets/dataset.py", line 12, in get_data\n'
    "FileNotFoundError: [Errno 2] No such file or directory: 'data/imagenet1k/validation'\n"
)


def _stopped_suite_log() -> str:
    """A suite the runner stopped: four tests ended, the fifth had started, the last line is
    cut short, and there is no ``SessionFinish``."""
    ok, sim, data = "tests/test_a.py::test_ok", "tests/test_a.py::test_sim", "tests/t.py::test_d"
    skipped, hung = "tests/test_a.py::test_two_ipus", "tests/test_b.py::test_real[4]"
    lines = [
        json.dumps({"pytest_version": "9.2.0", "$report_type": "SessionStart"}),
        _report(ok, "setup", "passed"),
        _report(ok, "call", "passed"),
        _report(ok, "teardown", "passed"),
        _report(sim, "setup", "passed"),
        _report(sim, "call", "failed", _script_failed("utils/test_tools.py"), _SIM_TRACEBACK),
        _report(sim, "teardown", "passed", printed=_SIM_TRACEBACK),
        _report(skipped, "setup", "skipped", ["tests/test_a.py", 9, "Skipped: needs 2 IPUs"]),
        _report(skipped, "teardown", "passed"),
        _report(data, "setup", "passed"),
        _report(data, "call", "failed", _script_failed("utils/test_tools.py"), _DATA_TRACEBACK),
        _report(data, "teardown", "passed"),
        _report(hung, "setup", "passed"),
        _report(hung, "call", "passed")[:40],  # the process was killed mid-line
    ]
    return "\n".join(lines) + "\n"


def test_a_stopped_suites_report_log_keeps_what_finished_and_names_what_ran(
    tmp_path: Path,
) -> None:
    log = tmp_path / "cnns-tests.jsonl"
    log.write_text(_stopped_suite_log())
    suite = garden_outcomes.read_report_log(log)
    outcomes = {case.name.split("::")[1]: case.outcome for case in suite.cases}
    assert outcomes == {
        "test_ok": "passed",
        "test_sim": "failed",
        "test_two_ipus": "skipped",
        "test_d": "failed",
    }
    assert suite.running == ["tests/test_b.py::test_real[4]"]
    assert not suite.finished


def test_each_failure_of_a_stopped_suite_is_classed_by_the_script_it_ran(tmp_path: Path) -> None:
    log = tmp_path / "cnns-tests.jsonl"
    log.write_text(_stopped_suite_log())
    step = garden.Step("cnns", "tests", "")
    failures = tmp_path / "failures.tsv"
    suite = garden_outcomes.read_report_log(log)
    counts = garden.count_cases(suite, step, PROJECT, APP, failures)
    assert counts == Counter(passed=1, failed=2, skipped=1)
    # The app's frame raised CalledProcessError; the script's own traceback says whose it is.
    assert step.classes == Counter(poptorch_sim=1, environment=1)
    rows = [line.split("\t") for line in failures.read_text().splitlines()]
    assert [row[:2] for row in rows] == [
        ["tests/test_a.py::test_sim", "poptorch_sim"],
        ["tests/t.py::test_d", "environment"],
    ]
    assert rows[0][2].endswith("<- TypeError: unsupported option 'x'")
    assert rows[1][2].endswith(
        "<- FileNotFoundError: [Errno 2] No such file or directory: 'data/imagenet1k/validation'"
    )


def test_a_script_that_logs_its_error_and_exits_gives_that_line_as_the_cause(
    tmp_path: Path,
) -> None:
    node = "tests/test_inference.py::TestInference::test_realdata_pipeline"
    printed = (
        "TEST FAILED\nstdout=[INFO] Loading the data\n"
        "[ERROR] No images found. Run get_images.sh script. Aborting...\n\nstderr=warnings\n"
    )
    lines = [
        _report(node, "setup", "passed"),
        _report(node, "call", "failed", _script_failed("utils/test_tools.py"), printed),
    ]
    log = tmp_path / "cnns-tests.jsonl"
    log.write_text("\n".join(lines) + "\n")
    (case,) = garden_outcomes.read_report_log(log).cases
    assert case.message.endswith(
        "<- [ERROR] No images found. Run get_images.sh script. Aborting..."
    )
    assert _classify(case.text) == "environment"


def test_the_junit_report_is_read_with_what_each_test_printed(tmp_path: Path) -> None:
    xml = tmp_path / "tests.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_a" name="test_ok"/>'
        '<testcase classname="tests.test_a" name="test_two_ipus"><skipped message="x"/></testcase>'
        '<testcase classname="tests.test_a" name="test_sim">'
        '<failure message="CalledProcessError: returned 1">utils/test_tools.py:23: in run'
        "</failure><system-out>"
        + escape(_SIM_TRACEBACK)
        + "</system-out></testcase></testsuite></testsuites>"
    )
    suite = garden_outcomes.read_junit(xml)
    assert [c.outcome for c in suite.cases] == ["passed", "skipped", "failed"]
    failed = suite.cases[2]
    assert failed.message == "CalledProcessError: returned 1 <- TypeError: unsupported option 'x'"
    assert garden_classify.classify(failed.text, PROJECT, APP) == "poptorch_sim"


# -- the second pass of PopTorch's tests ------------------------------------------------------
@pytest.mark.parametrize(
    ("case", "node"),
    [
        ("tests.misc_test::test_a[trace_model:True]", "misc_test.py::test_a[trace_model:True]"),
        ("options_test::test_b", "options_test.py::test_b"),
        ("tests.options_test.TestX::test_c", "options_test.py::TestX::test_c"),
        ("tests.gnn.nn.test_conv.TestY::test_d", "gnn/nn/test_conv.py::TestY::test_d"),
    ],
)
def test_a_junit_case_becomes_its_node_id(case: str, node: str) -> None:
    file = node.split("::")[0]
    assert second_pass.node_id(file, case) == node


_OPTIONS_TEST = (
    "def test_load():\n"
    "    message = 'x'\n"
    '    assert "SyntaxError at line 5 of tmp.conf: unexpected EOF " \\\n'
    '           "while parsing\\n" \\\n'
    '           "> options.outputMode(poptorch.OutputMode.All" in message\n'
)


def test_the_copy_accepts_the_newer_syntax_error_wording(tmp_path: Path) -> None:
    checkout = tmp_path / "poptorch"
    (checkout / "tests").mkdir(parents=True)
    (checkout / "python").mkdir()
    (checkout / "tests" / "options_test.py").write_text(_OPTIONS_TEST)
    tests = second_pass.prepare_copy(checkout, tmp_path / "out")
    text = (tests / "options_test.py").read_text()
    wanted = "SyntaxError at line 5 of tmp.conf: '(' was never closed\\n\" \\\n"
    assert wanted in text, text
    compile(text, "options_test.py", "exec")  # still Python
    assert (tests.parent / "python").resolve() == (checkout / "python").resolve()
    assert "unexpected EOF" in (checkout / "tests" / "options_test.py").read_text()


_PLUGIN_CHECK = """
import sys, types
helpers = types.ModuleType("helpers")
class LogChecker:
    def __init__(self, log):
        self._log = log
    def assert_contains(self, *s):
        raise AssertionError("missing")
class LogIterator:
    def __init__(self, lines):
        self._lines, self._all_checks = lines, []
    def _findNext(self, exprs):
        return next((x for x in self._lines if all(e in x for e in exprs)), None)
    def findNext(self, *exprs):
        raise AssertionError("missing")
helpers.LogChecker, helpers.LogIterator = LogChecker, LogIterator
sys.modules["helpers"] = helpers
import torch.utils.data
from benchmarks.poptorch_tests import obstacles
obstacles.pytest_configure(None)
class OldSampler(torch.utils.data.Sampler):
    def __init__(self, data):
        super().__init__(data)
OldSampler(range(4))
LogChecker("").assert_contains("popart")
try:  # PopTorch's documented warnings are still checked
    LogChecker("").assert_contains("Ignoring unexpected optimizer attribute")
    raise SystemExit("a documented warning's check was made to pass")
except AssertionError:
    pass
assert LogIterator(["a b", "c"]).findNext("c") == "c"
assert LogIterator(["a"]).findNext("z") == ""
print("ok")
"""


def test_the_plugin_restores_the_sampler_signature_and_passes_log_checks() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PLUGIN_CHECK], cwd=REPO, capture_output=True, text=True
    )
    assert done.stdout.strip() == "ok", done.stderr[-2000:]


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("options_test::test_log_cycle_count", "log\ndoes not contain 'Total number of IPU cycles: '"),
        ("weights_writing_test::test_seed_precompilation",
         "DEBUG Reading random seed\n The line above matches all of the expressions "
         "('Reading random seed',)"),
        ("debug_tensors_test::test_tensor_modes[mode3-1-Sum/1]",
         "log\ndoes not contain 'Gradient___fc2.bias Sum/1'"),
        ("io_performance_test::test_compare_io_performance[io_dtype10-io_dtype20]",
         "assert 0 == 62"),
        ("tensor_ops_test::test_requires_grad_true",
         "log\ndoes not contain 'Input tensor has requires_grad=True set. This tensor will be "
         "detached because backward pass via inputs is not supported.'"),
    ],
    ids=["cycles", "seed", "anchor", "io_performance", "requires_grad"],
)  # fmt: skip
def test_a_check_of_what_poptorch_sim_emits_is_behaviour(name: str, text: str) -> None:
    """poptorch_sim predicts a cycle count, keeps a random stream per model and logs each
    anchor's lowering line: a test of those that fails is poptorch_sim's, not the hardware's
    or PopART's log."""
    assert rules.classify(name, text)[0] == "behaviour"


def test_a_log_line_poptorch_sim_does_not_emit_is_log_ir() -> None:
    text = "log\ndoes not contain 'Compiling the graph'"
    assert rules.classify("x_test::test_y", text) == (
        "log/IR",
        "reads a log line poptorch_sim does not emit",
    )


def test_an_operand_read_from_an_absent_lowering_log_is_log_ir() -> None:
    """other_ops_test's scatter_add reads the operand's name from PopTorch's 'Graph before
    lowering' log; with the log checks made to pass it reads "", and its own regular expression
    built from that name is unbalanced."""
    text = "re.error: unbalanced parenthesis at position 30"
    cls, _ = rules.classify("other_ops_test::test_available_memory_scatter_add", text)
    assert cls == "log/IR"
    assert rules.classify("other_ops_test::test_gather", text)[0] == "behaviour"
