"""Mask quality and speed: SipMask against detectron2's Mask R-CNN, trained from scratch.

Both train on ``synthetic_masks_train`` and are scored on ``synthetic_masks_val`` (300
images, or its first ``--val-images``) by the library trainer
(``fcos_d2.engine.trainer.Trainer``): the same data loader and mapper (masks as
``INPUT.MASK_FORMAT`` says), optimizer, schedule, seed, precision and ``COCOEvaluator``
(bbox and segm). Everything but the detector comes from one base config
(``configs/quickstart-sipmask.yaml``; ``configs/quickstart.yaml`` with masks where the
SipMask config is missing): the ResNet trunk (depth, norm, stages), pixel statistics, input
sizes, solver and AMP. On top of it:

- ``sipmask``: the base config as it is (``MODEL.META_ARCHITECTURE: SipMask``);
- ``mask-rcnn``: detectron2's ``GeneralizedRCNN`` with its ResNet-FPN backbone on the same
  trunk (FPN from res2 up to the trunk's last stage, plus a max-pooled level above it, as
  detectron2's Mask R-CNN FPN has), RPN, box head (2 FC) and mask head
  (``MaskRCNNConvUpsampleHead``, 4 convs, 28 x 28 masks), as detectron2's
  ``Base-RCNN-FPN.yaml`` except the anchor sizes (one octave per level from 16 px, for the
  8-124 px objects), 128 sampled proposals per image instead of 512 (at most 6 objects
  an image) and mask-head convs as wide as the FPN (SipMask's head width) instead of 256.

Two data regimes (``--regime``, ``configs.REGIMES``): ``quickstart`` (the default, above)
and ``thin``: ``synthetic_thin_masks_train`` (400 images) and ``synthetic_thin_masks_val``
(100), the thin shapes of ``fcos_d2.data.synthetic_thin`` with their masks: 256-352 px
images at their own size, 10 classes of outlines, crosses, line-drawn glyphs and filled
shapes of 10-100 px, where a mask a few pixels wide must survive the mask branch's stride.
Its runs go to ``output/mask_quality_thin`` and their records say ``"mask_regime": "thin"``.

The schedule is the base config's, or that schedule scaled to ``--iters``: MAX_ITER
becomes ``--iters``, the lr steps and warm-up keep their fractions of it.

Each (contender, seed) runs in its own process with one thread, ``--jobs`` at a time
(``benchmarks.runner``); results go to ``OUTPUT/results.jsonl`` (runs found
there under the same shared regime and the same model, ``model_digest``, are not
repeated). Then one process times inference of both contenders' seed-0 models side by
side, one image at a time on one thread, alternating between them image by image
(``--latency-images`` val images, after a warm-up), and the table (mask AP mean, sample
std and range over seeds, box AP, median latency per image) is printed and written to
``OUTPUT/table.md``. Each run also appends a record (commit, CPU, seed, overrides, box and
mask AP, seconds) to ``benchmarks/results/masks.jsonl`` (``benchmarks.records``).

Each run's record also holds its box and mask AP per object size (the box's longer side in
the mask cap tool's bins: under 16 px, 16-32, 32-64, over 64), computed by pycocotools from
the detections its evaluation saved (``sizes``). ``--by-size`` scores stored runs that way
again, and ``--reevaluate KEY=VALUE`` evaluates their weights with an inference key changed
(e.g. ``MODEL.SIPMASK.MASK_THRESHOLD=0.5``), one record per run (``reevaluate``).

The modules: ``configs`` (the shared regime, Mask R-CNN on the same trunk, the key a stored
run must match), ``cli`` (one run, the latency, the table, the command), ``sizes`` (AP per
object size) and ``reevaluate`` (stored runs scored again).

Usage:
    python -m benchmarks.masks [--regime quickstart|thin] [--contenders sipmask mask-rcnn]
        [--seeds 0 1 2] [--iters N] [--val-images N] [--jobs 2] [--output DIR] [KEY VALUE ...]
    python -m benchmarks.masks --by-size [--output DIR] [KEY VALUE ...]
    python -m benchmarks.masks --reevaluate MODEL.SIPMASK.MASK_THRESHOLD=0.5 [--output DIR]
"""
