"""Seeing what an elastic job did: step events, progress lines, timelines, plots."""

from tensorflow_elastic.observability.steps import StepReporter

__all__ = ["StepReporter"]
