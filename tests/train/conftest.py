"""The toy task (tests/train/toy_task.py) in the registry for the tests that train it."""

import pytest

from tests.train import toy_task


@pytest.fixture(scope="module")
def toy_tasks():
    """The toy tasks registered for the tests of one module (`pytestmark =
    pytest.mark.usefixtures("toy_tasks")`), taken out of the registry after them."""
    toy_task.register_toy_tasks()
    yield
    toy_task.unregister_toy_tasks()
