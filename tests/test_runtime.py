"""Process setup: NumPy's BLAS on one thread unless the user chose a count."""

import os
import subprocess
import sys

import pytest

PROBE = (
    "from iris_rag.runtime import limit_blas_threads; limit_blas_threads(); "
    "from threadpoolctl import threadpool_info; "
    "print(max(i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas'))"
)
# On one core, one BLAS thread is the default anyway: nothing to tell apart.
pytestmark = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores")


def _blas_threads(**extra: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")} | extra
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return int(done.stdout.strip())


def test_blas_runs_on_one_thread_by_default() -> None:
    assert _blas_threads() == 1


def test_a_chosen_thread_count_is_kept() -> None:
    assert _blas_threads(OPENBLAS_NUM_THREADS="2") == 2
