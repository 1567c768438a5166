"""Side-by-side benchmark of the whole R-50 FCOS: fcos-d2 against torchvision's FCOS and
detectron2's built-in FCOS, in one process, same thread count, contenders interleaved
(one timing of each in turn, so that load from other processes hits all of them alike),
median of the timings after a warm-up. Prints a table per row and writes a JSON file.

Rows (``--rows``, comma-separated; default all but backends-ap and entry):
  inference  latency per image at batch 1 and throughput at batch 4, 800x1216, float32 and
             bf16 (CPU; fp16 AMP with --device cuda); fcos-d2 as configs/FCOS-R50.yaml,
             also with MODEL.FCOS.CHANNELS_LAST
  training   one iteration (forward, backward, SGD step), batch 2, 800x1216, 20 boxes each
  flops      backbone + head MACs (fvcore) and the achieved fraction of this machine's peak,
             the rate of a large 3x3 convolution timed in the same run
  memory     peak RSS (CUDA: peak allocated) of one inference and one training iteration,
             each contender in a fresh subprocess so that the peaks are its own
  parts      training targets + losses, and post-processing, against torchvision's
  onnx       the whole detector in onnxruntime, fp32 and int8, against PyTorch eager
  compile    torch.compile (inductor) of backbone + head against eager: inference and a
             training step, compile time, output difference
  loader     images/s of one loader worker: FCOSDatasetMapper against detectron2's
             DatasetMapper on 800x1333 JPEGs with the COCO augmentations
  labelenc   the plain FCOS that LabelEnc's step 2 leaves (LEF and adapter stripped, loaded
             strictly) against plain FCOS-R50: latency, parameters, MACs
  host       one training iteration of a tiny FCOS (ResNet-18 from scratch, 32-channel
             head, 2 images of 64x96) of fcos-d2, torchvision and detectron2: each one's
             host overhead per iteration (its time less its arithmetic floor)
  backends   MODEL.FCOS.INFERENCE_BACKEND at batch 1 (--backends-size, default 800x1216):
             eager fp32, bf16 compiled (native/emulated labelled), int8 PT2E, against
             torchvision fp32; compile seconds, agreement with fp32's best detections
  backends-ap  (only when named, with --ap-model CONFIG WEIGHTS, repeatable) the box AP of a
             trained model on its DATASETS.TEST under each MODEL.FCOS.INFERENCE_BACKEND,
             through --eval-only's code path, and its difference to eager fp32's
  entry      (only when named: it takes minutes) MODEL.FCOS.INFERENCE_BACKEND auto through
             its entry points, R-50 on --entry-images images of --entry-size (default 50,
             800x1216) against torchvision fp32's loop: the whole --eval-only command with a
             cold and a warm compile cache, DefaultPredictor's steady state, a fresh
             process's first call

The inference, training and host rows show each result beside its arithmetic floor: the
model's FLOPs over the rate of its own largest conv in that precision, timed in the same run
(``floor``).

Adding a row: one function ``row_<name>(args) -> List[dict]`` that prints its table and
returns its results, and an entry in ``ROWS`` (``benchmarks.speed.cli``).

Besides the JSON file, a run appends one record (commit, CPU kind with its bf16/AMX flags,
threads, every row's results, the target ratios, seconds) to
``benchmarks/results/speed.jsonl`` (``benchmarks.records``).

The modules: ``timing`` (interleaved medians, autocast, training steps, tables),
``contenders`` (the three R-50 FCOS), ``whole_model`` (the inference, training, flops and
memory rows), ``parts``, ``onnx_row``, ``compile_row``, ``loader_row``, ``labelenc_row``,
``host_row``, ``backends_row``, ``backends_ap_row``, ``entry_row`` (the other rows; the
entry row's runs, inputs and fresh process in ``entry_runs``, ``entry_data`` and
``entry_predictor``), ``floor`` (the arithmetic floors) and ``cli`` (the rows by name, the
targets, the command).

Usage: python -m benchmarks.speed [--rows inference,training] [--repeats 3] [--quick]
                                 [--device cpu|cuda] [--threads N] [--json output/benchmark.json]
"""
