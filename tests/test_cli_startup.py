"""The command line parses its arguments without torch (issue 41: ``xmatch --help`` and
``xmatch CMD --help`` took seconds of CPU importing the model stack). Checked by what is
imported, not by timing: ``benchmarks/cli_startup.py`` prints the CPU seconds."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from xmatch.cli.main import COMMANDS

HEAVY = ("torch", "transformers", "timm", "numpy", "faiss", "PIL")


def modules_after(code: str) -> set[str]:
    """The heavy modules a fresh interpreter has imported after running ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out.splitlines()[-1]))


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_imports_no_heavy_package(command):
    argv = ["--help"] if command is None else [command, "--help"]
    code = f"from xmatch.cli.main import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass"
    assert modules_after(code) == set()


def test_listing_the_zoo_imports_no_heavy_package():
    """The plugins' zoo entries are data: reading them imports none of their torch modules."""
    code = "import contextlib, io\nfrom xmatch.cli.main import main\nwith contextlib.redirect_stdout(io.StringIO()):\n    main(['models'])"
    assert modules_after(code) == set()


@pytest.mark.parametrize("entry", ["teran-mrsw-coco", "teran-mrsw-hn-scenes", "scan-t2i-avg-f30k"])
def test_a_card_imports_no_heavy_package_and_still_says_what_params_leave_out(entry):
    """``xmatch info`` reads whether a text encoder takes a corpus vocabulary from the
    builder's source, not by importing it (its card said so by importing torch)."""
    code = f"import contextlib, io\nfrom xmatch.cli.main import main\nwith contextlib.redirect_stdout(io.StringIO()):\n    main(['info', {entry!r}])"
    assert modules_after(code) == set()
    from xmatch.core.registry import get_registry

    encoders = get_registry("text_encoders")
    for name in encoders.names():  # the source reading agrees with the imported builders
        import inspect

        assert encoders.parameter_names(name) == tuple(inspect.signature(encoders.get(name)).parameters), name


def test_import_xmatch_is_light_and_its_public_names_load_on_use():
    assert modules_after("import xmatch, xmatch.regions") == set()
    assert "torch" in modules_after("import xmatch\nxmatch.build")
    import xmatch

    assert {"build", "MatchingModel", "Pooler", "list_models"} <= set(dir(xmatch))
    assert xmatch.index.__name__ == "xmatch.index" and xmatch.MatchingModel.__name__ == "MatchingModel"
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        xmatch.not_a_name  # noqa: B018
