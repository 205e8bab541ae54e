"""``xmatch extract --ray`` on a real local Ray cluster (``ray.init(num_cpus=2)``, the engine a
multi-node cluster runs): the same bytes as one process, a worker killed mid-chunk, a driver
killed and resumed, and the message where Ray is not installed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from xmatch.core.optional import MissingDependencyError
from xmatch.extract import extract
from xmatch.regions import RegionPipeline
from xmatch.testing import one_torch_thread  # noqa: F401  (a fixture: one torch thread, as each Ray worker of the 2-CPU cluster gets, so the bytes compare)

from test_extract import CLI_PIPE, PIPE, files_of, make_photos


@pytest.fixture()
def photos(tmp_path: Path) -> Path:
    return make_photos(tmp_path / "photos")


class DiesOnce(RegionPipeline):
    """The region pipeline, whose worker process exits on its first chunk (once: the marker
    file says it happened), as a worker killed mid-task would."""

    marker: str = ""

    def forward(self, prepared):
        if not os.path.exists(self.marker):
            Path(self.marker).write_text(str(os.getpid()))
            os._exit(1)
        return super().forward(prepared)


@pytest.mark.slow
def test_ray_extract_writes_the_bytes_of_one_process(photos, tmp_path, ray_cluster):
    one = extract(photos, tmp_path / "one", PIPE, batch_size=2, workers=0, progress=False)
    spread = extract(photos, tmp_path / "ray", PIPE, batch_size=2, progress=False, ray="local", ray_workers=2)
    assert (spread.images, spread.extracted, spread.skipped) == (one.images, 6, 0)
    assert files_of(tmp_path / "ray") == files_of(tmp_path / "one")
    precomp = extract(photos, tmp_path / "ray-precomp", PIPE, layout="precomp", batch_size=4, progress=False, ray="local")
    extract(photos, tmp_path / "one-precomp", PIPE, layout="precomp", batch_size=4, workers=0, progress=False)
    assert precomp.extracted == 6 and files_of(tmp_path / "ray-precomp") == files_of(tmp_path / "one-precomp")


@pytest.mark.slow
def test_a_worker_killed_mid_chunk_is_replaced_and_nothing_is_lost(photos, tmp_path, ray_cluster):
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test module
    try:
        extract(photos, tmp_path / "one", PIPE, batch_size=2, workers=0, progress=False)
        dies = DiesOnce.from_table(PIPE)  # random weights from the settings' seed: the same as PIPE's
        dies.marker = str(tmp_path / "died")
        result = extract(photos, tmp_path / "ray", dies, batch_size=2, progress=False, ray="local", ray_workers=2)
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert (tmp_path / "died").is_file(), "a worker exited mid-chunk"
    assert result.extracted == 6
    assert files_of(tmp_path / "ray") == files_of(tmp_path / "one")


@pytest.mark.slow
def test_a_killed_driver_resumes_with_nothing_lost(tmp_path, ray_cluster):
    rng = np.random.default_rng(0)
    folder = tmp_path / "many"
    folder.mkdir()
    for k in range(24):
        Image.fromarray(rng.integers(0, 256, (60, 80, 3), dtype=np.uint8)).save(folder / f"{k:02d}.png")
    args = [sys.executable, "-m", "xmatch", "extract", str(folder), "--batch-size", "2", *CLI_PIPE]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    address = ray_cluster.get_runtime_context().gcs_address
    subprocess.run([*args, "--workers", "0", "--out", str(tmp_path / "one")], check=True, env=env, capture_output=True)
    driver = subprocess.Popen([*args, "--out", str(tmp_path / "killed"), "--ray", address],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = tmp_path / "killed" / ".extract"
    deadline = time.time() + 180
    while time.time() < deadline and driver.poll() is None and not (state.is_dir() and any(state.glob("chunk-*.json"))):
        time.sleep(0.05)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    finished = len(list(state.glob("chunk-*.json")))
    assert 1 <= finished < 12, "killed mid-run"
    resumed = subprocess.run([*args, "--out", str(tmp_path / "killed"), "--ray", address, "--resume"],
                             env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "already done" in resumed.stdout
    assert files_of(tmp_path / "killed") == files_of(tmp_path / "one")


def test_without_ray_the_error_names_the_extra(photos, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(MissingDependencyError, match=r"pip install \"xmatch-zoo\[ray\]\""):
        extract(photos, tmp_path / "out", PIPE, batch_size=2, progress=False, ray="local")


@pytest.mark.slow
def test_ray_extract_of_shards_with_a_damaged_member_and_a_repeated_key_gives_one_process_files(tmp_path, ray_cluster):
    from test_webdataset_extract import picture
    from test_webdataset_layout import sample, write_shard

    good = picture(0, (40, 30))
    write_shard(tmp_path / "s" / "00000.tar", [*sample("a", good, b"a"), *sample("bad", b"\x89PNG garbage", b"bad"),
                                             *sample("b", good, b"b")])
    write_shard(tmp_path / "s" / "00001.tar", [*sample("a", picture(1, (40, 30)), b"a again"), *sample("c", good, b"c")])
    pattern = tmp_path / "s" / "{00000..00001}.tar"
    one = extract(pattern, tmp_path / "one", PIPE, batch_size=2, workers=0, progress=False)
    spread = extract(pattern, tmp_path / "ray", PIPE, batch_size=2, progress=False, ray="local", ray_workers=2)
    assert spread.images == one.images == 3 and [n for n, _ in spread.unreadable] == ["00000/bad"]
    assert files_of(tmp_path / "ray") == files_of(tmp_path / "one")  # the damaged member's reason included


def test_ray_workers_need_ray(photos, tmp_path):
    with pytest.raises(ValueError, match=r"ray_workers \(--ray-workers\) .* needs ray \(--ray\)"):
        extract(photos, tmp_path / "out", PIPE, progress=False, ray_workers=2)
    assert not (tmp_path / "out").exists()
