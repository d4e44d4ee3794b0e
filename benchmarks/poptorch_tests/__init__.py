"""Runs PopTorch's own test suite against poptorch_sim and classifies every failure."""
