import os
import random
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# the thread count fixed, so exact comparisons within a test never straddle two counts (test_threads.py turns it on)
os.environ.setdefault("SITE_LENS_ADAPTIVE_THREADS", "0")
sys.path.insert(0, str(Path(__file__).parent))

FV_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "fv"


@pytest.fixture(autouse=True)
def seed_everything():
    torch.manual_seed(0)
    random.seed(0)


@pytest.fixture(scope="module")
def model():
    from helpers import tiny

    torch.manual_seed(0)
    return tiny()


def _embedded(name: str):
    """The embedded model on the installed TransformerLens's default engine: HookedTransformer on 3.x, the
    TransformerBridge on 4.x."""
    from site_lens import load_model

    return load_model(name)


@pytest.fixture(scope="session")
def smollm():
    return _embedded("smollm2-135m")


@pytest.fixture(scope="session")
def gemma():
    return _embedded("gemma-3-270m")


@pytest.fixture
def fv_dir():
    if not FV_DIR.is_dir():
        pytest.skip(f"{FV_DIR} not present")
    return FV_DIR


@pytest.fixture(scope="session")
def bench_reference(tmp_path_factory):
    """(data, ref): the tiny task folders and one uninterrupted run of ``small.bench_cmd`` on them, in a fresh
    process, for the tests that kill, share or resume a bench run and compare it with this one."""
    import subprocess

    from small import bench_cmd, write_task_dir

    root = tmp_path_factory.mktemp("bench_reference")
    data, ref = write_task_dir(root / "data"), root / "ref"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(bench_cmd(data, ref), env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return data, ref
