"""The backends-ap row of ``python -m benchmarks.speed``: the box AP of a trained model under
each ``MODEL.FCOS.INFERENCE_BACKEND`` (eager fp32, bf16 compiled with frozen weights, int8 by
PT2E), evaluated on its config's DATASETS.TEST through ``--eval-only``'s own code path
(``fcos_d2.engine.trainer.evaluate_weights``: the library trainer's model, checkpointer,
test loader, evaluator and fast-inference copy), with each backend's AP less eager fp32's.

    python -m benchmarks.speed --rows backends-ap \\
        --ap-model configs/quickstart.yaml output/quickstart/model_final.pth

(``--ap-register-coco NAME JSON IMAGES``, repeatable, registers a COCO-format test set a
model's config names, as ``train_net.py --register-coco``.)

One record per (model, dataset, backend): AP, AP50, ``AP_minus_eager``, the seconds of the
whole evaluation (model built, weights loaded, compiling, calibrating, every image, COCO
scoring), the number of images and whether the CPU runs the backend's precision natively.
A backend this CPU cannot run is recorded as skipped with the reason (int8 without
``torchao``; bf16 without native bf16 or int8 without int8 dot-product units, unless
``--ap-emulated``), a backend that fails as failed with the error. int8's first
``INT8_CALIBRATION_BATCHES`` test images calibrate its ranges and are scored from float32
outputs (the backend's own behaviour, ``fcos_d2/modeling/inference_backends.py``).
"""
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from detectron2.config import CfgNode, get_cfg
from detectron2.data import DatasetCatalog

from fcos_d2.config import add_fcos_config
from fcos_d2.data.register import check_num_classes, register_coco_dataset
from fcos_d2.modeling.inference_backends import (INT8_CALIBRATION_BATCHES, cpu_capabilities,
                                                 torchao_available)
from fcos_d2.trainer_extensions import trainer_extensions_for

ROW = "backends-ap"
# eager first: the others' reference; auto last, the default (what it ran is in its record)
BACKENDS = ("eager", "bf16_compiled", "int8_pt2e", "auto")
AP_TOLERANCE = 1.0  # issue 52: each backend's AP within 1.0 of fp32's
AUTO_AP_TOLERANCE = 0.1  # issue 63: the default's AP within 0.1 of fp32's
USAGE = ("--rows backends-ap needs the models to evaluate: --ap-model CONFIG WEIGHTS "
         "(repeatable), e.g. --ap-model configs/quickstart.yaml "
         "output/quickstart/model_final.pth (trained by `make quickstart`)")


def eval_config(config_file: str, weights: str, backend: str, output_dir: str) -> CfgNode:
    """The frozen config ``train_net.py --config-file config_file --eval-only MODEL.WEIGHTS
    weights MODEL.FCOS.INFERENCE_BACKEND backend OUTPUT_DIR output_dir MODEL.DEVICE cpu``
    evaluates with: ``fcos_d2.engine.trainer.setup``'s steps for ``--eval-only`` (file,
    overrides, the classes checked, the extensions' ``check_config`` and ``adjust_config``)
    without ``default_setup``'s logs and seeding, which do not change the evaluation."""
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(config_file)
    cfg.merge_from_list(["MODEL.WEIGHTS", weights, "MODEL.FCOS.INFERENCE_BACKEND", backend,
                         "OUTPUT_DIR", output_dir, "MODEL.DEVICE", "cpu"])
    check_num_classes([*cfg.DATASETS.TRAIN, *cfg.DATASETS.TEST], cfg.MODEL.FCOS.NUM_CLASSES)
    for extension in trainer_extensions_for(cfg):
        extension.check_config(cfg)
        extension.adjust_config(cfg)
    cfg.freeze()
    return cfg


def precision(backend: str) -> str:
    """"native" or "emulated": whether this CPU has the units of ``backend``'s precision
    (bf16: AVX512-BF16/AMX-BF16; int8: AMX-INT8/VNNI); "" for eager fp32, and for auto
    where it runs fp32."""
    if backend == "auto":  # bf16 (eager or compiled) only where it is native, else fp32
        return "native" if cpu_capabilities()["native_bf16"] else ""
    need = {"bf16_compiled": "native_bf16", "int8_pt2e": "native_int8"}.get(backend)
    if need is None:
        return ""
    return "native" if cpu_capabilities()[need] else "emulated"


def skip_reason(backend: str, emulated_ok: bool) -> str:
    """Why this CPU does not evaluate ``backend`` ("" if it does)."""
    if backend == "int8_pt2e" and not torchao_available():
        return "torchao is not installed (PT2E quantization's home since torch 2.10): " \
               "pip install torchao"
    if precision(backend) == "emulated" and not emulated_ok:
        units = "native bf16 (AVX512-BF16/AMX-BF16)" if backend == "bf16_compiled" else \
            "int8 dot-product units (AMX-INT8/VNNI)"
        return f"this CPU has no {units}: emulated, the backend is no deployment choice " \
               f"here; pass --ap-emulated to evaluate it anyway"
    return ""


def auto_choice(cfg: CfgNode) -> str:
    """The line ``auto`` logs for ``--eval-only`` on ``cfg`` (its test images per worker)
    with nothing in the compile cache (the row evaluates with a cache folder of its own)."""
    from fcos_d2.engine.trainer import test_images_per_worker
    from fcos_d2.modeling.backend_choice import choose_backend

    return choose_backend("auto", "cpu", test_images_per_worker(cfg)).reason


def evaluate(cfg: CfgNode) -> Tuple[Dict[str, dict], float]:
    """({dataset: {"bbox": {...}, ...}}, seconds) of ``--eval-only`` on ``cfg``."""
    from fcos_d2.engine.trainer import evaluate_weights

    start = time.perf_counter()
    results, _ = evaluate_weights(cfg)
    seconds = time.perf_counter() - start
    if len(cfg.DATASETS.TEST) == 1:  # DefaultTrainer.test unwraps a single dataset's results
        results = {cfg.DATASETS.TEST[0]: results}
    return dict(results), seconds


def model_records(config_file: str, weights: str, output_dir: Path,
                  emulated_ok: bool) -> List[dict]:
    """The records of one model: per backend, per dataset of its DATASETS.TEST."""
    records: List[dict] = []
    eager_ap: Dict[str, float] = {}
    for backend in BACKENDS:
        base = {"row": ROW, "model": config_file, "weights": weights, "backend": backend}
        reason = skip_reason(backend, emulated_ok)
        if reason:
            records.append({**base, "skipped": reason})
            continue
        cfg = eval_config(config_file, weights, backend,
                          str(output_dir / Path(config_file).stem / backend))
        if backend == "auto":
            base["auto_choice"] = auto_choice(cfg)
        try:
            results, seconds = evaluate(cfg)
        except Exception as error:  # a failed backend is a result; eager's is the run's end
            if backend == "eager":
                raise
            records.append({**base, "failed": f"{type(error).__name__}: {error}"})
            continue
        for dataset, result in results.items():
            records.append(_record(base, dataset, result["bbox"], seconds, eager_ap))
    return records


def _record(base: dict, dataset: str, bbox: dict, seconds: float,
            eager_ap: Dict[str, float]) -> dict:
    """One evaluation's record; eager's AP per dataset is kept in ``eager_ap``."""
    backend = base["backend"]
    if backend == "eager":
        eager_ap[dataset] = bbox["AP"]
    record = {**base, "dataset": dataset, "precision": precision(backend) or "fp32",
              "AP": round(bbox["AP"], 3), "AP50": round(bbox["AP50"], 3),
              "AP_minus_eager": round(bbox["AP"] - eager_ap[dataset], 3),
              "eval_seconds": round(seconds, 1), "images": len(DatasetCatalog.get(dataset))}
    if backend == "int8_pt2e":
        record["calibration_images"] = INT8_CALIBRATION_BATCHES  # test batches are 1 image
    return record


def targets(records: List[dict]) -> Dict[str, float]:
    """Each evaluated backend's AP less eager fp32's, named with the issue's target."""
    def tolerance(backend: str) -> float:
        return AUTO_AP_TOLERANCE if backend == "auto" else AP_TOLERANCE

    return {f"{r['backend']} AP - eager fp32 AP, {Path(r['model']).name} on {r['dataset']} "
            f"(target: within {tolerance(r['backend'])})": r["AP_minus_eager"]
            for r in records if "AP" in r and r["backend"] != "eager"}


def describe(record: dict) -> str:
    """One printed line of a record."""
    head = f"  {Path(record['model']).name:28s} {record['backend']:14s}"
    if "AP" not in record:
        return f"{head} {'skipped' if 'skipped' in record else 'failed'}: " \
               f"{record.get('skipped') or record.get('failed')}"
    return (f"{head} {record['precision']:8s} AP {record['AP']:6.2f}  AP50 {record['AP50']:6.2f}"
            f"  AP - eager {record['AP_minus_eager']:+6.2f}  {record['eval_seconds']:7.1f} s "
            f"for {record['images']} images of {record['dataset']}")


def register_datasets(datasets: List[Tuple[str, str, str]]) -> None:
    """Registers each (name, annotations json, image folder) not registered yet, as
    ``train_net.py --register-coco`` does: the test sets of models trained on them."""
    for name, json_file, image_root in datasets:
        if name not in DatasetCatalog.list():
            register_coco_dataset(name, json_file, image_root)


def row(args, models: Optional[List[Tuple[str, str]]] = None) -> List[dict]:
    """The row's records for ``args.ap_model`` (or ``models``); without any model, the usage
    and SystemExit(2). ``args``: device, ap_output, ap_emulated, ap_register_coco."""
    print(f"\n[{ROW}: box AP per MODEL.FCOS.INFERENCE_BACKEND, through --eval-only]")
    if args.device != "cpu":
        print("  skipped: the inference backends are CPU paths")
        return [{"row": ROW, "skipped": "the inference backends are CPU paths"}]
    models = args.ap_model if models is None else models
    if not models:
        print(f"  {USAGE}")
        raise SystemExit(2)
    register_datasets(args.ap_register_coco)
    records: List[dict] = []
    for config_file, weights in models:
        for record in model_records(config_file, weights, Path(args.ap_output),
                                    args.ap_emulated):
            print(describe(record))
            records.append(record)
    found = targets(records)
    if found:
        records[-1]["targets"] = found
    return records
