"""A model's traced functions are kept per world size: a re-form back to a size reuses them."""

from tensorflow_elastic.training import keras as tfe_keras


class FakeModel:
    """What `_retrace_if_world_changed` touches of a Keras model."""

    def __init__(self):
        self.traces = 0
        self.make_train_function(force=True)
        self.test_function = "test"
        self.predict_function = "predict"

    def make_train_function(self, force=False):
        self.traces += 1
        self.train_function = f"train-{self.traces}"


def test_a_world_size_seen_before_gets_its_functions_back_without_a_new_trace():
    model = FakeModel()
    tfe_keras._retrace_if_world_changed(model, 3)
    assert (model.train_function, model.traces) == ("train-1", 1)
    tfe_keras._retrace_if_world_changed(model, 2)
    assert (model.train_function, model.test_function, model.predict_function) == (
        "train-2", None, None)
    model.test_function = "test-at-2"
    tfe_keras._retrace_if_world_changed(model, 3)
    assert (model.train_function, model.test_function, model.predict_function, model.traces) == (
        "train-1", "test", "predict", 2)
    tfe_keras._retrace_if_world_changed(model, 2)
    assert (model.train_function, model.test_function, model.traces) == ("train-2", "test-at-2", 2)


def test_the_same_world_size_keeps_the_functions():
    model = FakeModel()
    tfe_keras._retrace_if_world_changed(model, 2)
    tfe_keras._retrace_if_world_changed(model, 2)
    assert (model.train_function, model.traces) == ("train-1", 1)
