"""Issue 45's "done when": with the Hub emulated locally, ``xmatch index ENTRY --images photos/
--out idx && xmatch search idx --text "a cat"`` works by the entry's name, no file given, for
every CLIP/SigLIP entry's layout: the weights and the tokenizer come from the commits the entry
pins, are checked against the Hub's own metadata, and a tampered file is refused.

Each entry is served at its own pinned repository and commits. Its full-size weights (0.6 to
3.5 GB) are too large for the default run, so a tiny model of the entry's family (the same
transformers layout: tensor names, tokenizer kind) is served there and a throwaway entry with the
real entry's spec, tiny tower sizes and the real entry's pins is indexed by name. One test
(``slow``) serves random full-size ViT-B/32 weights and indexes with ``clip-vit-b-32`` itself.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import xmatch
from xmatch.cli.main import main
from xmatch.core.registry import models
from xmatch.core.sources import parse_hf_source
from xmatch.io import hub

from clip_assets import tiny_tower_overrides, tokenizer_dirs
from hub_emulator import HubEmulator, hub_emulator  # noqa: F401  (a fixture)

pytest.importorskip("faiss")
Image = pytest.importorskip("PIL.Image")

TOWERS = {"clip-vision": "clip", "siglip-vision": "siglip"}


def tower_entries() -> list[str]:
    """Every zoo entry built on the CLIP or SigLIP towers."""
    return [n for n in xmatch.list_models() if xmatch.info(n).spec.get("image_encoder", {}).get("name") in TOWERS]


#: entries for which no public record shows a commit of their repository with model.safetensors
#: (their notes say so and how to load a downloaded file); every other entry must load by name
UNPINNED = {"clip-vit-l-14-336"}


def family(name: str) -> str:
    return TOWERS[xmatch.info(name).spec["image_encoder"]["name"]]


def pins(name: str) -> tuple[tuple[str, str, str], tuple[str, str]]:
    """((repo, commit, file) of the weights, (repo, commit) of the tokenizer) the entry names."""
    entry = xmatch.info(name)
    assert entry.weights, f"{name} lists no weights: it cannot load by name"
    repo, commit, path = parse_hf_source(entry.weights[0]["source"])
    tok_repo, tok_commit, _ = parse_hf_source(entry.spec["text_encoder"]["tokenizer"])
    return (repo, commit, path), (tok_repo, tok_commit)


def upstream_weights(model: xmatch.MatchingModel, kind: str, folder: Path) -> bytes:
    """``model``'s towers as transformers' CLIPModel / SiglipModel saves them (model.safetensors)."""
    from transformers import CLIPConfig, CLIPModel, SiglipConfig, SiglipModel

    configs = {"text_config": model.text_encoder.text_model.config.to_dict(),
               "vision_config": model.image_encoder.vision_model.config.to_dict()}
    ref = CLIPModel(CLIPConfig(**configs, projection_dim=model.embed_dim)) if kind == "clip" else SiglipModel(SiglipConfig(**configs))
    missing, unexpected = ref.load_state_dict({**model.image_encoder.state_dict(), **model.text_encoder.state_dict()}, strict=False)
    assert not unexpected and set(missing) <= {"logit_scale", "logit_bias"}
    ref.save_pretrained(folder)
    return (folder / "model.safetensors").read_bytes()


def tokenizer_files(folder: str | Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in Path(folder).iterdir() if p.is_file()}


def serve(emulator: HubEmulator, name: str, weights: bytes, tokenizer: dict[str, bytes]) -> None:
    """Put the weights and the tokenizer files at the commits ``name`` pins (one commit may hold both)."""
    (repo, commit, path), (tok_repo, tok_commit) = pins(name)
    commits: dict[tuple[str, str], dict[str, bytes]] = {}
    commits.setdefault((repo, commit), {})[path] = weights
    commits.setdefault((tok_repo, tok_commit), {}).update(tokenizer)
    for (r, c), files in commits.items():
        emulator.add_commit(r, c, files, branch=None)


def photos(root: Path, n: int = 4) -> list[str]:
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    names = [f"photo{k}.png" for k in range(n)]
    for k, name in enumerate(names):
        Image.fromarray(rng.integers(0, 256, size=(48 + 8 * k, 64, 3), dtype=np.uint8)).save(root / name)
    return names


def tiny_variant(name: str) -> xmatch.ZooEntry:
    """The entry with tiny towers of its family, keeping its pins (weights and tokenizer); the
    sha256 and size an entry may give describe its full-size file, so the variant leaves them to
    the Hub's metadata."""
    entry = xmatch.info(name)
    kind = family(name)
    spec = copy.deepcopy(entry.spec)
    overrides = tiny_tower_overrides(kind)
    spec["embed_dim"] = overrides["embed_dim"]
    spec["image_encoder"].update(overrides["image_encoder"])
    spec["text_encoder"].update({k: v for k, v in overrides["text_encoder"].items() if k != "tokenizer"})
    return xmatch.ZooEntry(name=f"{name}-tiny-layout", spec=spec, description="tiny towers at the entry's pins",
                           weights=[{"source": w["source"]} for w in entry.weights], origin=entry.origin)


def index_and_search(tmp_path: Path, name: str, capsys: pytest.CaptureFixture) -> tuple[list[str], list[dict]]:
    names = photos(tmp_path / "photos")
    out = tmp_path / "idx"
    assert main(["index", name, "--images", str(tmp_path / "photos"), "--out", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["search", str(out), "--text", "a cat", "-k", "3", "--json"]) == 0
    return names, json.loads(capsys.readouterr().out)[0]["hits"]


def expected_top(model: xmatch.MatchingModel, root: Path, names: list[str], k: int = 3) -> list[str]:
    pictures = [Image.open(root / n).convert("RGB") for n in names]
    with torch.no_grad():
        cosine = model.similarity(model.encode_images(xmatch.PixelInputs(pictures)), model.encode_texts(["a cat"]))[:, 0]
    return [names[i] for i in cosine.topk(k).indices.tolist()]


def test_every_clip_and_siglip_entry_pins_commits_for_its_weights_and_tokenizer():
    entries = tower_entries()
    assert {"clip-vit-b-32", "siglip-base-patch16-224"} <= set(entries)
    assert {n for n in entries if not xmatch.info(n).weights} == UNPINNED
    for name in sorted(set(entries) - UNPINNED):
        (_, commit, path), (_, tok_commit) = pins(name)
        assert len(commit) == 40 and len(tok_commit) == 40 and path == "model.safetensors", name
    for name in UNPINNED:
        assert "checkpoint=" in xmatch.info(name).notes, "an entry without weights says how to load a downloaded file"


@pytest.mark.parametrize("name", sorted(set(tower_entries()) - UNPINNED))
def test_an_entry_indexes_photos_by_name_from_the_hub_and_search_finds_them(name, hub_emulator, tmp_path, capsys):  # noqa: F811
    kind = family(name)
    variant = tiny_variant(name)
    with models.restored():
        models.register(variant.name, variant)
        torch.manual_seed(0)
        model = xmatch.build(variant.name).eval()
        serve(hub_emulator, name, upstream_weights(model, kind, tmp_path / "upstream"), tokenizer_files(tokenizer_dirs()[kind]))
        names, hits = index_and_search(tmp_path, variant.name, capsys)
        assert [h["id"] for h in hits] == expected_top(model, tmp_path / "photos", names)
        # of the entry's repositories, nothing but the pinned commits was asked for
        (repo, commit, _), (tok_repo, tok_commit) = pins(name)
        asked = {r.path for r in hub_emulator.requests if r.server == "hub" and (f"/{repo}/" in r.path or f"/{tok_repo}/" in r.path)}
        assert asked and all(commit in p or tok_commit in p for p in asked), asked
        # a second process finds it all in the cache, offline
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("XMATCH_OFFLINE", "1")
            patch.setattr(hub, "_DIGESTS", {})
            again = xmatch.build(variant.name, pretrained=True)
        towers = {k: v for k, v in model.state_dict().items() if k.startswith(("image_encoder.", "text_encoder."))}
        assert {k: v for k, v in again.state_dict().items() if k in towers}.keys() == towers.keys()
        assert all(torch.equal(again.state_dict()[k], v) for k, v in towers.items())


def test_a_tampered_weights_file_at_the_pinned_commit_is_refused_and_nothing_is_indexed(hub_emulator, tmp_path, capsys):  # noqa: F811
    name = "clip-vit-b-32"
    variant = tiny_variant(name)
    with models.restored():
        models.register(variant.name, variant)
        model = xmatch.build(variant.name).eval()
        weights = upstream_weights(model, "clip", tmp_path / "upstream")
        serve(hub_emulator, name, weights, tokenizer_files(tokenizer_dirs()["clip"]))
        (repo, commit, path), _ = pins(name)
        damaged = bytearray(weights)
        damaged[-1] ^= 0xFF
        hub_emulator.tamper(repo, commit, path, bytes(damaged))
        photos(tmp_path / "photos")
        code = main(["index", variant.name, "--images", str(tmp_path / "photos"), "--out", str(tmp_path / "idx"), "--no-progress"])
        err = capsys.readouterr().err
        assert code != 0 and "sha256" in err and commit in err, err
        assert not (tmp_path / "idx").exists()


def clip_tokenizer_with_clips_vocabulary(folder: Path) -> Path:
    """A tokenizer with CLIP's 49,408 ids and its start and end tokens at 49406 / 49407 (the
    tower pools the end token), spelling every text one byte symbol per piece."""
    from tokenizers import pre_tokenizers
    from transformers import CLIPTokenizer

    symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    pieces = symbols + [s + "</w>" for s in symbols]
    pieces += [f"<filler{k}>" for k in range(49406 - len(pieces))] + ["<|startoftext|>", "<|endoftext|>"]
    CLIPTokenizer(vocab={p: i for i, p in enumerate(pieces)}, merges=[]).save_pretrained(folder)
    return folder


def padded_to(weights: bytes, size: int) -> bytes:
    """The same safetensors file ``size`` bytes long: its JSON header padded with spaces (as
    safetensors' own writer pads it), so random weights have the size the entry states for the
    published file."""
    header = int.from_bytes(weights[:8], "little")
    extra = size - len(weights)
    assert extra >= 0 and extra % 8 == 0, extra
    return (header + extra).to_bytes(8, "little") + weights[8:8 + header] + b" " * extra + weights[8 + header:]


@pytest.mark.slow
def test_clip_vit_b_32_itself_loads_full_size_weights_by_name(hub_emulator, tmp_path):  # noqa: F811
    """The real entry, no overrides, as a user runs it: the two commands in their own
    processes, told where the Hub is by HF_ENDPOINT alone, with random full-size ViT-B/32
    weights (605 MB) in transformers' layout at the pinned commit."""
    torch.manual_seed(0)
    model = xmatch.build("clip-vit-b-32").eval()
    weights = upstream_weights(model, "clip", tmp_path / "upstream")
    stated = [w.get("size") for w in xmatch.info("clip-vit-b-32").weights][0]
    serve(hub_emulator, "clip-vit-b-32", weights if stated is None else padded_to(weights, stated),
          tokenizer_files(clip_tokenizer_with_clips_vocabulary(tmp_path / "tok")))
    names = photos(tmp_path / "photos")
    env = hub_emulator.env(OMP_NUM_THREADS="1")
    xmatch_cli = [sys.executable, "-m", "xmatch"]
    index = subprocess.run([*xmatch_cli, "index", "clip-vit-b-32", "--images", str(tmp_path / "photos"),
                            "--out", str(tmp_path / "idx"), "--no-progress"], env=env, capture_output=True, text=True)
    assert index.returncode == 0, index.stderr
    search = subprocess.run([*xmatch_cli, "search", str(tmp_path / "idx"), "--text", "a cat", "-k", "3", "--json"],
                            env=env, capture_output=True, text=True)
    assert search.returncode == 0, search.stderr
    hits = json.loads(search.stdout)[0]["hits"]
    assert [h["id"] for h in hits] == expected_top(model, tmp_path / "photos", names)
    assert (Path(env["XMATCH_HOME"]) / "verified" / "models--openai--clip-vit-base-patch32").is_dir()
