"""A single-process stand-in for Horovod, for the model-garden run only.

Graphcore's applications import ``horovod.torch`` at module level but call it only when they run
as several instances (PopDist). Horovod builds from source against the installed torch, which
fails where torch is a CUDA build and the CUDA toolkit is absent; this stand-in then answers as
one process would (size 1, rank 0, collectives return their input). ``garden.py`` puts it on the
path only where the real package did not install, and says so in its table.
"""

__version__ = "0.0+model-garden-stand-in"
