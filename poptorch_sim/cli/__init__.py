"""The command-line entry points, one module per command.

===============================================  ==================================================
command                                          module
===============================================  ==================================================
``python -m poptorch_sim SCRIPT [ARGS...]``      ``cli/run.py``: run an unmodified PopTorch program
``python -m poptorch_sim.poprun ...``            ``cli/poprun.py``: PopRun's launcher (instances)
``python -m poptorch_sim.shard --config ...``    ``cli/shard.py``: PopRT's manual sharding config
``python -m poptorch_sim.memory SCRIPT``         ``memory/__main__.py``: the memory report
``python -m poptorch_sim.datasets [ROOT]``       ``datasets/__main__.py``: MNIST or its stand-in
``python -m poptorch_sim.distributed.instance``  what the launcher starts in each process
===============================================  ==================================================

``python -m`` needs a module at the command's name, so ``poptorch_sim/__main__.py``,
``poptorch_sim/poprun.py`` and ``poptorch_sim/shard.py`` are two-line forwarders to the modules
here. A package's own command stays in that package. ``cli/program.py`` runs a user's program
as ``__main__``, for every command that runs one.
"""
