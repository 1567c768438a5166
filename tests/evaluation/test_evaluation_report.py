"""After each evaluation, report.html beside summary.txt: precision-recall curves from COCOeval's
precision array, the AP per class as bars, and the worst images, detections beside the truth.

The evaluations here score hand-made detections on the 4-image synthetic COCO dataset; the
browser check opens the page in headless Chromium (the Debian package `chromium`)."""
import json
import re
import shutil
import subprocess
import uuid
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import torch
from detectron2.config import get_cfg
from detectron2.data import DatasetCatalog
from detectron2.structures import Boxes, BoxMode, Instances
from PIL import Image

from fcos_d2 import add_fcos_config
from fcos_d2.data.register import register_coco_dataset
from fcos_d2.evaluation.report import ReportOptions
from fcos_d2.evaluation.report.curves import pr_curves
from fcos_d2.evaluation.report.errors import match_image
from fcos_d2.evaluation.report.evaluator import ReportingCOCOEvaluator


def detections(boxes, classes, scores, size=(128, 128)) -> Instances:
    boxes = torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4)
    return Instances(size, pred_boxes=Boxes(boxes),
                     scores=torch.tensor(scores, dtype=torch.float32),
                     pred_classes=torch.tensor(classes, dtype=torch.int64))


def evaluate(dataset_dicts, name, output_dir, options=ReportOptions()):
    """Detections = the ground truth, except: image 1 misses its first box; image 2 misses its
    first box and has a false one (a box of another class). Returns the results."""
    evaluator = ReportingCOCOEvaluator(name, tasks=("bbox",), distributed=False,
                                       use_fast_impl=False, output_dir=str(output_dir),
                                       report=options)
    evaluator.reset()
    for index, record in enumerate(dataset_dicts):
        boxes = [BoxMode.convert(a["bbox"], a["bbox_mode"], BoxMode.XYXY_ABS)
                 for a in record["annotations"]]
        classes = [a["category_id"] for a in record["annotations"]]
        if index == 2:
            boxes, classes = boxes + [[0, 0, 20, 20]], classes + [(classes[0] + 1) % 6]
        if index in (1, 2):
            boxes, classes = boxes[1:], classes[1:]
        found = detections(boxes, classes, [0.9] * len(boxes))
        evaluator.process([{"image_id": record["image_id"], "file_name": record["file_name"]}],
                          [{"instances": found}])
    return evaluator.evaluate()


@pytest.fixture(scope="module")
def registered(dataset):
    name = f"report_tiny_{uuid.uuid4().hex[:6]}"
    register_coco_dataset(name, str(dataset / "annotations.json"), str(dataset / "images"))
    return name, DatasetCatalog.get(name)


class _Images(HTMLParser):
    def __init__(self):
        super().__init__()
        self.sources = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.sources.append(dict(attrs)["src"])


def image_sources(page: Path):
    parser = _Images()
    parser.feed(page.read_text())
    return parser.sources


@pytest.fixture(scope="module")
def report(registered, tmp_path_factory):
    name, dicts = registered
    output = tmp_path_factory.mktemp("report")
    return evaluate(dicts, name, output), output


def test_the_report_shows_curves_per_class_and_for_all_ap_bars_and_the_worst_images_first(
        report, registered):
    results, output = report
    _, dicts = registered
    classes = sorted({a["category_id"] for d in dicts for a in d["annotations"]})
    sources = image_sources(output / "report.html")
    assert sources[0] == "report/pr_bbox_all.png"
    assert sources[1:1 + len(classes)] == [f"report/pr_bbox_{k}.png" for k in classes]
    assert sources[1 + len(classes)] == "report/ap_bbox.png"
    assert sources[2 + len(classes):] == ["report/worst_00.png", "report/worst_01.png"]
    assert all((output / s).is_file() for s in sources)
    captions = re.findall(r"<figcaption>(.*?)</figcaption>", (output / "report.html").read_text())
    assert captions[0].startswith(f"{Path(dicts[2]['file_name']).name} (image id "
                                  f"{dicts[2]['image_id']}): 1 missed, 1 false of ")
    assert captions[1].startswith(f"{Path(dicts[1]['file_name']).name} (image id "
                                  f"{dicts[1]['image_id']}): 1 missed, 0 false of ")
    left_half = np.asarray(Image.open(output / "report/worst_00.png"))[:, :256]
    assert left_half.shape[0] == 256 and (left_half == [255, 150, 0]).all(axis=2).any()  # missed
    assert results["bbox"]["AP"] < 100.0


def test_no_report_with_TEST_REPORT_ENABLED_False_and_the_same_metrics(report, registered,
                                                                         tmp_path):
    name, dicts = registered
    results = evaluate(dicts, name, tmp_path, ReportOptions(enabled=False))
    assert json.dumps(results) == json.dumps(report[0])  # NaN (no large boxes) reads as NaN
    assert not (tmp_path / "report.html").exists() and not (tmp_path / "report").exists()


def test_report_keys_out_of_range_are_refused_by_name():
    cfg = get_cfg()
    add_fcos_config(cfg)
    assert ReportOptions.from_config(cfg) == ReportOptions(True, 8, 0.5, 0.5)
    cfg.TEST.REPORT.IOU_THRESH = 1.5
    with pytest.raises(ValueError, match=r"TEST.REPORT.IOU_THRESH: 1.5 is not in \[0, 1\]"):
        ReportOptions.from_config(cfg)
    cfg.TEST.REPORT.IOU_THRESH, cfg.TEST.REPORT.NUM_WORST_IMAGES = 0.5, -1
    with pytest.raises(ValueError, match="TEST.REPORT.NUM_WORST_IMAGES: -1 is not a count"):
        ReportOptions.from_config(cfg)


def test_curves_read_cocoeval_precision_at_area_all_and_100_detections():
    precision = np.full((10, 101, 2, 4, 3), 0.25)
    precision[:, :, 0, 0, 2] = np.linspace(1.0, 0.1, 10)[:, None]  # class 0: by IoU threshold
    precision[:, :, 1] = -1  # class 1 has no ground truth
    curves = pr_curves(precision)
    assert np.allclose(curves["IoU=0.50"][0], 1.0) and np.allclose(curves["IoU=0.75"][0], 0.5)
    assert np.allclose(curves["IoU=0.50:0.95"][0], 0.55)
    assert np.isnan(curves["IoU=0.50"][1]).all()
    assert np.allclose(curves["IoU=0.75"][2], 0.5)  # all classes: those with ground truth


def test_matching_counts_duplicates_and_wrong_classes_as_false_and_ignores_crowd_boxes():
    gt = {"boxes": np.array([[0, 0, 10, 10], [20, 20, 30, 30], [40, 40, 60, 60.0]]),
          "classes": np.array([0, 0, 1]), "crowd": np.array([False, False, True])}
    boxes = np.array([[0, 0, 10, 10], [0, 0, 10, 11], [20, 20, 30, 30], [40, 40, 60, 60.0]])
    outcome = match_image(7, boxes, np.array([0.9, 0.8, 0.7, 0.6]), np.array([0, 0, 1, 1]),
                          gt, iou_thresh=0.5)
    # the duplicate and the wrong class are false; on the crowd box: not false, not needed
    assert outcome.matched.tolist() == [True, False, False, True]
    assert outcome.found.tolist() == [True, False, True]
    assert (outcome.false_positives, outcome.missed, outcome.errors) == (2, 1, 3)


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    pytest.skip("no headless browser: install Debian's chromium (`make browser`, or "
                "apt-get install chromium) to check report.html in a browser")


def open_in_browser(page: Path, *flags: str) -> str:
    result = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                             "--virtual-time-budget=5000", "--window-size=1200,1400", *flags,
                             page.as_uri()], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_report_html_opens_in_chromium_with_every_image_loaded(report, tmp_path):
    _, output = report
    dom = open_in_browser(output / "report.html", "--dump-dom")
    count = len(image_sources(output / "report.html"))
    assert f'data-images="{count}"' in dom and 'data-broken-images="0"' in dom, dom[-500:]
    open_in_browser(output / "report.html", f"--screenshot={tmp_path / 'shot.png'}")
    shot = np.asarray(Image.open(tmp_path / "shot.png").convert("L"), dtype=np.float64)
    assert shot.std() > 10 and (shot < 128).mean() > 0.01  # not blank: text and plots drawn

    broken = tmp_path / "broken"  # the check itself: a page with a missing picture fails it
    shutil.copytree(output, broken)
    (broken / "report" / "worst_01.png").unlink()
    dom = open_in_browser(broken / "report.html", "--dump-dom")
    assert 'data-broken-images="1"' in dom and "did not load: report/worst_01.png" in dom
