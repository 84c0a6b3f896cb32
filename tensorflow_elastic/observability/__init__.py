"""Seeing what an elastic job did: the events record every part appends to, step events,
progress lines, timelines and plots, serving Prometheus metrics over HTTP.
"""

from tensorflow_elastic.observability.steps import StepReporter

__all__ = ["StepReporter"]
