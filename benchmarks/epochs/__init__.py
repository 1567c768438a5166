"""AP against epochs for the small-data recipe (``configs/FCOS-R18-small-data.yaml``): how
long a training on a few hundred images pays (issue 54).

Each (epochs E, seed) trains the recipe through the library trainer
(``fcos_d2.engine.trainer``, what ``train_net.py`` runs) with its schedule in epochs, the
recipe's proportions scaled to E: ``SOLVER.EPOCHS`` E, the LR step at 5/6 of E and a linear
warm-up of E/12 (the recipe's 1000 and 100 of 1200 iterations), evaluating every
``--eval-every`` epochs (each evaluation is a point of the curve along that run) and at the
end (the point at E). The data are a regime of the training-quality benchmark
(``benchmarks.train_quality.protocol.REGIMES``): the first 400 train and 100 val images of
the synthetic shapes ("shapes": 128 px, 6 classes) or of the thin objects ("thin": 256-352
px, 10 classes), with the config overrides that regime's data need.

Each run is a child process (``benchmarks.runner.run_all``, ``--jobs`` at a time, each with
``--threads`` threads). It appends a record (``benchmarks.records``: commit, CPU kind, seed,
overrides, final AP and AP50, the curve, seconds; regime, epochs and iterations in "run") to
``OUTPUT/results.jsonl`` and to ``benchmarks/results/epochs.jsonl``; runs found in
``OUTPUT/results.jsonl`` with the same settings and overrides are not repeated. The table
(final AP at each E: mean, sample std and range over the seeds, and the best AP along the
runs) is printed and written to ``OUTPUT/table.md``; ``python -m benchmarks.tables`` makes
``docs/results/epochs.md`` from the repository's records.

The modules: ``curve`` (one run: its schedule, its trainer command line, its curve and its
record) and ``cli`` (the command).

Usage:
    python -m benchmarks.epochs --regime thin --epochs 12 24 36 48 --seeds 0 1 2
    python -m benchmarks.epochs --regime shapes --dry-run   # the trainer commands only
    python -m benchmarks.epochs ... MODEL.DEVICE cuda        # KEY VALUE: more overrides
"""
