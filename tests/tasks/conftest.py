"""Fixtures of the task tests: lm-eval's task index over the project's tasks/ folder."""

from __future__ import annotations

from pathlib import Path

import pytest

TASKS_DIR = Path(__file__).resolve().parents[2] / "tasks"


@pytest.fixture(scope="session")
def task_manager(shared_data_dir):
    """lm-eval's TaskManager over tasks/ alone (the tasks read the benchmark data: skips without it)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(TASKS_DIR), include_defaults=False)
