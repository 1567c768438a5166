"""Training-quality benchmark: FCOS implementations trained from scratch on small data.

The regime: the first 400 images of the built-in synthetic shapes train split (6
classes, 128 x 128, boxes of 8-124 px, used at their own size), evaluated with COCO box AP
on the first 100 val images. The model and optimizer are those of
``configs/FCOS-R18-small-data.yaml``: ResNet-18 with BN from scratch, FPN P3-P7 (P6/P7
from P5), a 128-channel GN head with 4 convs per tower, random flip, SGD (momentum 0.9,
weight decay 1e-4 on every parameter), batch 4, lr 0.01; the schedule (``REGIME``, for
every contender) is half the config's length: 600 iterations, lr x0.1 at 500, and the
linear warm-up of 50 iterations the protocol has always had (the config's 100 of 1200,
scaled; its warm-up of a third of the schedule until 2026-12-04 is contender
``fcos-d2 recipe+warmup-200``), so that a run takes
about 4 minutes on one CPU core. Relative to the strides, the objects are as large
as 10-100 px objects in 256-352 px images.

The second regime (``--regime thin``, ``REGIMES``): the 400 train and 100 val images of
``fcos_d2.data.synthetic_thin`` (10 classes of thin outlines, crosses and line-drawn glyphs
as well as filled shapes, objects of 10-100 px in images of 256 x 256-352 px, each used at
its own size), the same model, optimizer and schedule, 5 seeds by default; its results go
to their own folder (``output/train_quality_thin``) and carry "regime": "thin", and a
results file of one regime is refused for the other.

Every contender gets the same ResNet trunk (the FCOS ones the same backbone, built by
fcos-d2's backbone builder), data loader, optimizer, schedule, seeds and evaluator; only the
detector on top differs:

- ``fcos-d2 <variant>``: fcos-d2 with ``MODEL.FCOS`` options (``VARIANTS``);
- ``torchvision``: ``torchvision.models.detection.FCOS`` on the same backbone;
- ``detectron2``: detectron2's built-in FCOS (``detectron2.modeling.meta_arch.fcos``,
  unregistered, in v0.6 and main), where the installed detectron2 has it;
  ``detectron2+<variant>`` with a schedule change (``DETECTRON2_VARIANTS``).
- ``detectron2 faster-rcnn``: detectron2's Faster R-CNN (GeneralizedRCNN, RPN,
  StandardROIHeads, ``benchmarks.rcnn``) on the same ResNet trunk, its FPN from res2 as
  detectron2's FPN models have it.

Each (contender, seed) runs in its own process with one thread; ``--jobs`` run at once.
With ``MODEL.DEVICE cuda`` at the end of the command, every contender trains and is
evaluated on the GPU (the ``--jobs`` runs share it; data loading and COCO evaluation stay
on one CPU thread each).
Results are appended to ``OUTPUT/results.jsonl`` (runs found there are not repeated), and
the table (mean, sample std and range of AP over seeds) is printed and written to
``OUTPUT/table.md``. Each run also appends a record (commit, CPU, seed, overrides,
AP, iterations done, training seconds and seconds per iteration) to
``benchmarks/results/train_quality.jsonl`` (``benchmarks.records``), whose generated table
(``python -m benchmarks.tables``) also gives every contender at equal iterations and at equal
training time (``equal_time``).

A run that is killed (its session or job ends) loses at most ``resume.CHECKPOINT_SECONDS``
(10 minutes) of training: every 10 minutes it saves where it is in its run folder
(``OUTPUT/runs/<contender>-<seed>/resume.pth``), and the same command started again resumes
each such run there, then ends as the run would have uninterrupted (the same batches and
augmentations, weights equal bit for bit). Its record adds up the training seconds of
every attempt and says where it resumed ("resumed": from_iteration, and "exact": whether
the data stream was found where it was saved). LabelEnc's two-step runs and
``--diagnostics`` runs start again instead.

The modules: ``protocol`` (the regimes, the config, training and evaluation every
contender gets), ``contenders`` (the ``Contender`` interface and the one-step contenders),
``adapters`` (torchvision's and detectron2's FCOS behind detectron2's model interface),
``labelenc`` (LabelEnc's two steps as contenders), ``catalog`` (every contender by name),
``results`` (the run records and tables), ``equal_time`` (the records at equal iterations
and equal training time), ``costs`` (iteration costs), ``diagnostics``,
``reevaluate`` and ``analyses`` (the modes that read stored runs), ``resume`` (a killed
run's saved state), ``cli`` (the command).

Usage:
    python -m benchmarks.train_quality [--regime shapes|thin] [--contenders all|NAME ...]
                                       [--seeds 0 1 2] [--jobs 2] [--output DIR] [--diagnostics]
                                       [KEY VALUE ...]
    python -m benchmarks.train_quality --regime thin --jobs 10 MODEL.DEVICE cuda  # on a GPU
    python -m benchmarks.train_quality --list
    python -m benchmarks.train_quality --labelenc-cost 20   # seconds per training iteration
    python -m benchmarks.train_quality --regime-cost 10     # the same, per regime
    python -m benchmarks.train_quality --regime thin --positives  # positives per level
    python -m benchmarks.train_quality --regime thin --reevaluate 500  # stored runs, 500 more
                                                                       # validation images
    python -m benchmarks.train_quality --regime thin --weight-growth  # stored runs' weight norms
"""
