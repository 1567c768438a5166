"""The built-in synthetic shapes set: deterministic, fair, tightly annotated, cached safely."""
import json
import multiprocessing
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fcos_d2  # noqa: F401  (compat shims before detectron2)
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.structures import BoxMode

from fcos_d2.data import prepare_dataset, synthetic

SEED = synthetic.SPLIT_SEEDS["val"]
SAMPLE = 200  # images of the val split the statistics below are measured on


@pytest.fixture(scope="module")
def val_sample(tmp_path_factory) -> Path:
    return synthetic.ensure_synthetic_shapes(
        "val", root=tmp_path_factory.mktemp("cache"), num_images=SAMPLE)


def _coco(split_dir: Path) -> dict:
    return json.loads((split_dir / "annotations.json").read_text())


def _max_sides(coco: dict) -> np.ndarray:
    return np.array([max(a["bbox"][2:]) for a in coco["annotations"]])


def test_two_generations_give_identical_annotations_and_image_bytes(tmp_path):
    for folder in ("a", "b"):
        synthetic.write_split(tmp_path / folder, split="val", num_images=12)
    assert (tmp_path / "a/annotations.json").read_bytes() == \
        (tmp_path / "b/annotations.json").read_bytes()
    images = sorted(p.name for p in (tmp_path / "a/images").iterdir())
    assert images == [f"{i:06d}.png" for i in range(12)]
    for name in images:
        assert (tmp_path / "a/images" / name).read_bytes() == \
            (tmp_path / "b/images" / name).read_bytes()


def test_a_smaller_count_gives_a_prefix_of_the_split(tmp_path, val_sample):
    small = synthetic.ensure_synthetic_shapes("val", root=tmp_path, num_images=5)
    assert small.name == "val_5"
    expected = [a for a in _coco(val_sample)["annotations"] if a["image_id"] <= 5]
    assert _coco(small)["annotations"] == expected


def test_categories_are_at_least_five_shapes_with_ids_1_to_k_and_all_occur(val_sample):
    coco = _coco(val_sample)
    names = [c["name"] for c in coco["categories"]]
    assert names == list(synthetic.CLASS_NAMES) and len(names) >= 5
    assert [c["id"] for c in coco["categories"]] == list(range(1, len(names) + 1))
    used = {a["category_id"] for a in coco["annotations"]}
    assert used == set(range(1, len(names) + 1))
    assert all(a["iscrowd"] == 0 for a in coco["annotations"])


def test_colours_come_from_one_palette_whatever_the_class():
    colours = {name: set() for name in synthetic.CLASS_NAMES}
    palette = {tuple(int(c) for c in colour) for colour in synthetic.PALETTE}
    for index in range(SAMPLE):
        for obj in synthetic.render_image(seed=SEED, index=index)[1]:
            colours[synthetic.CLASS_NAMES[obj.class_index]].add(obj.color)
    for name, used in colours.items():
        assert used <= palette, name
        assert len(used) >= len(palette) - 2, name


def test_tight_box_of_a_hand_made_mask():
    mask = np.zeros((10, 12), dtype=bool)
    mask[3:7, 2:10] = True
    mask[5, 2:5] = False
    assert synthetic.tight_box(mask) == (2, 3, 8, 4)


def test_axis_aligned_square_fills_its_corner_pixels():
    # corners at 64 -+ 10 in x and y; PIL fills polygons up to and including their edges
    mask = synthetic.shape_mask("square", center=(64, 64), radius=10 * 2**0.5)
    assert synthetic.tight_box(mask) == (54, 54, 21, 21)
    assert mask.sum() == 21 * 21


def test_boxes_lie_in_the_image_and_are_tight_to_the_drawn_pixels(val_sample):
    coco = _coco(val_sample)
    for image in coco["images"][:60]:
        pixels = np.asarray(Image.open(val_sample / "images" / image["file_name"]))
        rendered, objects = synthetic.render_image(seed=SEED, index=image["id"] - 1)
        np.testing.assert_array_equal(pixels, rendered)  # lossless: the file is the render
        annotations = [a for a in coco["annotations"] if a["image_id"] == image["id"]]
        assert len(annotations) == len(objects)
        for annotation, obj in zip(annotations, objects):
            x, y, w, h = annotation["bbox"]
            assert 0 <= x < x + w <= 128 and 0 <= y < y + h <= 128
            painted = (pixels == obj.color).all(axis=2) & obj.visible_mask
            assert painted.sum() == obj.visible_mask.sum() == annotation["area"]
            assert not painted[:, :x].any() and not painted[:, x + w:].any()
            assert not painted[:y].any() and not painted[y + h:].any()
            assert painted[y].any() and painted[y + h - 1].any()  # rows on the box edges
            assert painted[:, x].any() and painted[:, x + w - 1].any()


def test_box_sizes_cover_every_octave_from_8_to_128_px(val_sample):
    sides = _max_sides(_coco(val_sample))
    assert sides.min() >= synthetic.MIN_BOX_SIZE and sides.max() <= 128
    counts, _ = np.histogram(sides, bins=[8, 16, 32, 64, 129])
    assert (counts >= 0.12 * len(sides)).all(), counts


def test_objects_per_image_range_from_0_to_6_and_about_5_percent_are_empty(val_sample):
    coco = _coco(val_sample)
    per_image = np.bincount([a["image_id"] for a in coco["annotations"]], minlength=SAMPLE + 1)
    per_image = per_image[1:]
    assert per_image.max() == synthetic.MAX_OBJECTS
    assert 0.01 * SAMPLE <= (per_image == 0).sum() <= 0.12 * SAMPLE
    assert set(per_image) == set(range(synthetic.MAX_OBJECTS + 1))


def test_no_object_is_hidden_more_than_half():
    fractions = [obj.visible_mask.sum() / obj.full_area
                 for index in range(SAMPLE)
                 for obj in synthetic.render_image(seed=SEED, index=index)[1]]
    assert min(fractions) >= 1 - synthetic.MAX_HIDDEN_FRACTION
    assert min(fractions) < 0.95  # overlaps do happen


def test_cache_root_is_relocated_by_the_environment_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("FCOS_D2_DATASETS_CACHE", str(tmp_path))
    assert synthetic.datasets_cache_root() == tmp_path / "synthetic_shapes_v1"
    monkeypatch.delenv("FCOS_D2_DATASETS_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    expected = tmp_path / "home/.cache/fcos_d2/synthetic_shapes_v1"
    assert synthetic.datasets_cache_root() == expected


def test_unknown_split_is_an_error_naming_it(tmp_path):
    with pytest.raises(ValueError, match="unknown split 'test'"):
        synthetic.ensure_synthetic_shapes("test", root=tmp_path)


def test_interrupted_generation_leaves_no_split_and_the_next_call_completes(
        tmp_path, monkeypatch):
    render = synthetic.render_image

    def interrupted(*, seed, index):
        if index == 3:
            raise KeyboardInterrupt
        return render(seed=seed, index=index)

    monkeypatch.setattr(synthetic, "render_image", interrupted)
    with pytest.raises(KeyboardInterrupt):
        synthetic.ensure_synthetic_shapes("val", root=tmp_path, num_images=6)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []
    monkeypatch.setattr(synthetic, "render_image", render)
    split_dir = synthetic.ensure_synthetic_shapes("val", root=tmp_path, num_images=6)
    assert len(_coco(split_dir)["images"]) == 6


def test_temporary_folder_left_by_a_killed_run_is_removed(tmp_path):
    stale = tmp_path / ".val_4.tmp-killed"
    (stale / "images").mkdir(parents=True)
    split_dir = synthetic.ensure_synthetic_shapes("val", root=tmp_path, num_images=4)
    assert not stale.exists()
    assert len(list((split_dir / "images").iterdir())) == 4


def _generate_in(root: str) -> None:
    synthetic.ensure_synthetic_shapes("val", root=Path(root), num_images=30)


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(),
                    reason="needs the fork start method")
def test_processes_generating_at_once_leave_one_complete_split(tmp_path):
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_generate_in, args=(str(tmp_path),)) for _ in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert [worker.exitcode for worker in workers] == [0, 0, 0]
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == \
        ["val_30"]
    synthetic.write_split(tmp_path / "reference", split="val", num_images=30)
    assert _coco(tmp_path / "val_30") == _coco(tmp_path / "reference")


@pytest.fixture
def registered_in_tmp(tmp_path, monkeypatch):
    """Registers the synthetic names afresh under a temporary cache with few images."""
    monkeypatch.setitem(synthetic.NUM_IMAGES, "train", 8)
    monkeypatch.setitem(synthetic.NUM_IMAGES, "val", 5)
    monkeypatch.setenv("FCOS_D2_DATASETS_CACHE", str(tmp_path))
    original_root = Path(MetadataCatalog.get("synthetic_shapes_val").json_file).parents[1]
    _unregister()
    synthetic.register_synthetic_shapes()
    yield tmp_path / "synthetic_shapes_v1"
    _unregister()
    synthetic.register_synthetic_shapes(root=original_root)


def _unregister() -> None:
    for name in synthetic.DATASET_SPLITS:
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)


def test_registered_names_load_as_detectron2_dicts(registered_in_tmp):
    for name, count in (("synthetic_shapes_train", 8), ("synthetic_shapes_val", 5)):
        dicts = DatasetCatalog.get(name)
        assert len(dicts) == count
        assert all(Path(d["file_name"]).is_file() and d["height"] == d["width"] == 128
                   for d in dicts)
        annotations = [a for d in dicts for a in d["annotations"]]
        assert annotations and all(a["bbox_mode"] == BoxMode.XYWH_ABS for a in annotations)
        assert {a["category_id"] for a in annotations} <= set(range(6))
        metadata = MetadataCatalog.get(name)
        assert metadata.thing_classes == list(synthetic.CLASS_NAMES)
        assert metadata.evaluator_type == "coco"
        assert metadata.json_file.startswith(str(registered_in_tmp))


def test_prepare_dataset_generates_the_json_file_the_metadata_names(registered_in_tmp):
    json_file = Path(MetadataCatalog.get("synthetic_shapes_val").json_file)
    assert not json_file.exists()
    prepare_dataset("synthetic_shapes_val")
    assert json_file.is_file() and len(json.loads(json_file.read_text())["images"]) == 5
    assert not (registered_in_tmp / "train").exists()


def test_prepare_dataset_does_nothing_for_other_names(registered_in_tmp):
    prepare_dataset("coco_2017_val")
    assert not registered_in_tmp.exists()


def test_registering_twice_is_harmless(registered_in_tmp):
    synthetic.register_synthetic_shapes()
    synthetic.register_synthetic_shapes(root=registered_in_tmp / "elsewhere")
    assert MetadataCatalog.get("synthetic_shapes_train").json_file == \
        str(registered_in_tmp / "train/annotations.json")
