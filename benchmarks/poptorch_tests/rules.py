"""The classifier: which failure of a PopTorch test is poptorch_sim's fault, and which is not.

Each rule is ``(class, pattern, reason)``; the first whose regular expression matches the test id
or the failure text (message plus traceback) decides. A failure no rule matches is *behaviour*:
the default blames poptorch_sim, so a new kind of failure is never hidden.

Classes:
  behaviour  poptorch_sim does something PopTorch would not (a wrong value, a missing check,
             a crash, a hang).
  log/IR     the test reads PopART's IR, a Poplar profile or a log line (PopART's, or one of
             PopTorch's C++ debug lines) that poptorch_sim does not emit.
  torch      the test itself is incompatible with this environment (torch 2.14, Python 3.11, no
             ``python3`` with torch on PATH): it fails the same way with no poptorch involved
             (``--show-torch`` runs the plain reproductions in ``REPRODUCTIONS``).
  hardware   the test needs IPU hardware or the Poplar SDK: PopART profiles and protos, custom-op
             builds, real compile times, PopVision files, downloads. Not cycle counts (poptorch_sim
             predicts ``cycleCount()`` and logs "Total number of IPU cycles"), the random seed
             and RNG state (a random stream per model, with PopTorch's log lines) or
             ``FastGatherLastDim`` (implemented): a failure of those is behaviour.
"""

from __future__ import annotations

import re

CLASSES = ("behaviour", "log/IR", "torch", "hardware")

_LOG = (
    r"All of the expressions do not match|No line in the above log contains all|"
    r"The log above doesn't contain lines matching|\sdoes not contain '|Did not contain .* after|"
    r"The line above matches all of the|\ncontains '"
)

RULES: list[tuple[str, str, str]] = [
    # -- crashes that surface inside a log a test was reading: still behaviour ----------------
    ("behaviour", r"DistributedError: cannot join", "offline compile joined a process group"),
    ("behaviour", r"Timeout \+\+\+|Failed: Timeout", "ran past the per-test timeout"),
    # -- the test, not poptorch_sim: fails the same way with plain torch / Python ---------------
    ("torch", r"Unexpected lines in output:\s*Traceback[^\n]*\n[^\n]*<string>[^\n]*\n[^\n]*"
     r"process_to_kill_asyncdataloader\n\s*KeyboardInterrupt",
     "a race in the test on a loaded machine: its SIGINT reaches the parent while it is still in "
     "print(), before its try: block (the worker process exits quietly, as asked)"),
    ("torch", r"torch_geometric.typing' has no attribute 'WITH_TORCH_CLUSTER_BATCH_SIZE'",
     "PyG's knn needs torch_cluster, which is not installed (without it the pinned pyg-nightly "
     "does not even define the flag its knn reads)"),
    ("torch", r"KeyError: 'disable_dynamic_shapes'|edge_conv' has no attribute 'knn'",
     "poptorch_geometric's substitutions need the pyg-nightly PopTorch pins "
     "(2.4.0.dev20230613), not this PyG"),
    ("torch", r"object\.__init__\(\) takes exactly one argument",
     "its Sampler subclass passes data_source to Sampler.__init__, which torch >= 2.2 no longer "
     "takes (REPRODUCTIONS['sampler'])"),
    ("torch", r"SyntaxError at line \d+ of .*: '\(' was never closed",
     "expects Python 3.8's SyntaxError text 'unexpected EOF while parsing'; Python >= 3.10 says "
     "\"'(' was never closed\" (REPRODUCTIONS['syntax'])"),
    ("torch", r"test_saving_of_begin_block[\s\S]*Command '\['python3'\]' timed out after 10 s",
     "its `python3` subprocess must import torch and poptorch within 10 s: on this shared, loaded "
     "machine `import torch` alone takes 12 s wall (2.9 s CPU). Run without the limit, the "
     "subprocess prints 'BeginBlock(user_id=1, ipu_id=2)' as the test asks"),
    ("torch", r"test_saving_of_begin_block",
     "loads a whole pickled module in a `python3` subprocess: torch >= 2.6 torch.load defaults "
     "to weights_only=True (REPRODUCTIONS['weights_only']), and `python3` on PATH has no torch"),
    ("torch", r"Weights only load failed",
     "torch.load of a whole pickled object: torch >= 2.6 defaults to weights_only=True "
     "(REPRODUCTIONS['weights_only'])"),
    ("torch", r"masked_fill_ only supports boolean masks",
     "indexes with a uint8 mask, which torch 2.14 refuses in eager PyTorch too "
     "(REPRODUCTIONS['uint8_mask'])"),
    ("torch", r"No module named '(torch_geometric|torch_scatter|torch_cluster|torch_sparse|"
     r"pyg_lib)'|requires either 'pyg-lib' or 'torch-sparse'|requires 'torch-sparse'",
     "needs PyTorch Geometric or its compiled extensions (torch_scatter, torch_cluster, "
     "torch_sparse, pyg-lib), which this environment lacks"),
    ("torch", r"'Summary' object has no attribute 'num_nodes_per_type'|cannot import name "
     r"'SubgraphType' from 'torch_geometric",
     "needs the pyg-nightly (2.4.0.dev20230613) PopTorch pins; PyG 2.3.1, the release before it, "
     "lacks this API (later releases change the Collater poptorch_geometric subclasses)"),
    ("torch", r"Norm\.forward\(\) takes from 2 to 3 positional arguments|cannot import name "
     r"'(RotatE|SelectOutput)' from 'torch_geometric|'NoneType' object has no attribute 'knn'",
     "needs the pinned pyg-nightly's API (PyG 2.3.1 lacks it) or torch_cluster (not installed)"),
    ("torch", r"torch\.fx\._symbolic_trace' has no attribute 'Union'|HypergraphConv\.forward\(\) "
     r"takes|invalid value for 'combine_root'|requires `torch-cluster`|gnn\.ops\.test_spline_conv_ops",
     "PyG (2.3.1 or the pinned pyg-nightly) against torch 2.14 (torch.fx no longer exports "
     "Union), or torch_cluster / torch_spline_conv, which this environment lacks"),
    ("torch", r"test_error_mismatch|test_reject_fuzzy_match_without_fuzzy_option",
     "expects an older pytest's 'Regex pattern ... does not match' wording for pytest.raises"),
    ("torch", r"fixture 'benchmark' not found",
     "needs the pytest-benchmark plugin, which this environment lacks"),
    ("torch", r"No module named 'expecttest'",
     "imports expecttest, a package of PyTorch's own test suite, which this environment lacks"),
    ("torch", r"Command '\['python3', '-m', 'pytest'",
     "re-runs pytest with `python3` from PATH, which is not this environment's interpreter"),
    # -- needs the SDK or hardware --------------------------------------------------------------
    ("hardware", r"test_get_compilation_time",
     "asserts a Poplar compile takes over a second"),
    ("hardware", r"No executable saved in the cache",
     "expects Poplar executables in the executable cache (compiling is instant here)"),
    ("hardware", r"test_profile_report|test_export_proto_file",
     "expects PopART's profile / ONNX proto files on disk"),
    ("hardware", r"No module named 'pva'|No module named 'libpvti'",
     "reads a PopVision profile (pva / libpvti from the Poplar SDK)"),
    ("hardware", r"custom_ops\.so|custom_cube_op|libcustom|cmake",
     "builds a custom op against the Poplar SDK"),
    ("hardware", r"test_doc_urls",
     "fetches the documentation's URLs over the network (requests; no network here)"),
    ("hardware", r"tests/\.datasets/\w+ not exists",
     "reads a data set (QM9, Planetoid) that PopTorch's CI downloads beforehand"),
    ("hardware", r"urlopen|URLError|HTTPError|Name or service not known",
     "downloads data"),

    # -- PopART IR and log lines ------------------------------------------------------------
    ("log/IR", r"ops_test::test_name_scope\b|Expected maingraph in serialized IR|"
     r"KeyError: 'maingraph'",
     "reads PopART's IR (_debugGetPopartIR)"),
    ("log/IR", r"_debugGetPopartIR|test_\w*_IR\b|lowered to PopART|MatMulPartialsType|"
     r"device=ipu:\d", "reads PopART's IR"),
    ("log/IR", r"debug_tensors_test::test_tensor_names",
     "expects PopART's IR tensor names (input, loss, scaledLearningRate___, "
     "weightDecayScaleFactor___) among the anchorable tensors"),
    ("log/IR", r"graph optimizer|enablePipelining set to value|mode\(Pipelined\)",
     "reads PopART's log (optimizer / pipelining set-up)"),
    ("log/IR", r"From the user configuration: Ipu model|set enableEngineCaching to value|"
     r"cache file locked", "reads a PopTorch C++ log line (IPU model, executable cache)"),
    ("log/IR", r"popart:\w+ \\d|popart:devicex|popart:ir|layer: layer:",
     "reads PopART's own log"),
    ("log/IR", r"lossScaling=\d|defaultVelocityScaling", "reads PopART's optimizer log"),
    ("log/IR", r"test_available_memory_(linear|scatter_add)[\s\S]*(no attribute 'group'|"
     r"re\.error: unbalanced parenthesis)",
     "reads the set_available_memory node's operand from PopTorch's 'Graph before lowering to "
     "PopART' log: with log checks made to pass, no such line is found to read it from (the "
     "empty name read instead leaves scatter_add's own regular expression unbalanced)"),
    ("log/IR", r"poplar_executor_test::test_distributed_compile[\s\S]*no attribute 'group'",
     "times the executable cache's lock from PopTorch's C++ log lines ('cache file locked', "
     "'released the cache lock'): with log checks made to pass, no such line is found to read "
     "a time from"),
    ("behaviour", r"unexpected optimizer attribute|unexpected group \\d attribute|"
     r"Ignoring unexpected (optimizer|group \d) attribute",
     "PopTorch's documented 'Ignoring unexpected ...' warning (relaxOptimizerAttributesChecks) "
     "is missing, or given where PopTorch gives none"),
    ("log/IR", r"copyWeightsToHost\(\)",
     "reads PopTorch's 'Implicit copyWeightsToHost()' before an optimizer state upload "
     "(PopART's weight buffers are rewritten by it; there is no such buffer here)"),
    # PopTorch's lines that poptorch_sim emits: a check of one that fails is poptorch_sim's
    # (helpers.LogChecker's messages put the expressions after "contain" / "match").
    ("behaviour", r"(contain|match)[^\n]*(Reading random seed|Reading RNG state|Setting random "
     r"seed|Setting RNG state|Total number of IPU cycles|\w+ (ALL|EVERYN|FINAL|Sum)/\d|"
     r"Input tensor has requires_grad=True set)",
     "a PopTorch log line poptorch_sim emits (the model's random stream, the predicted cycle "
     "count, an anchor's lowering line, the detached-input warning) is missing, or given where "
     "PopTorch gives none"),
    ("log/IR", _LOG, "reads a log line poptorch_sim does not emit"),
]  # fmt: skip

_COMPILED = [(cls, re.compile(pat), reason) for cls, pat, reason in RULES]

# Plain torch / Python programs showing each "torch" failure with no poptorch involved.
REPRODUCTIONS: dict[str, str] = {
    "sampler": (
        "import torch\n"
        "class S(torch.utils.data.Sampler):\n"
        "    def __init__(self, data):\n"
        "        super().__init__(data)\n"
        "S(range(4))\n"
    ),
    "syntax": 'compile("options.outputMode(poptorch.OutputMode.All", "tmp.conf", "exec")\n',
    "weights_only": (
        "import io, torch\n"
        "f = io.BytesIO(); torch.save(torch.nn.Sequential(torch.nn.ReLU()), f); f.seek(0)\n"
        "torch.load(f)\n"
    ),
    "uint8_mask": (
        "import torch\nt = torch.zeros(2, 3); t[torch.ones(2, 3, dtype=torch.uint8)] = 1.0\n"
    ),
}


def classify(name: str, message: str) -> tuple[str, str]:
    """The class and reason of one failure, from its test id and failure text."""
    text = name + "\n" + message
    for cls, pattern, reason in _COMPILED:
        if pattern.search(text):
            return cls, reason
    first = next((line for line in message.splitlines() if line.strip()), "")
    return "behaviour", first[:160]
