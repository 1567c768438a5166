"""``python -m benchmarks.train_quality``: the command of ``benchmarks.train_quality.cli``."""
from benchmarks.train_quality.cli import main

if __name__ == "__main__":
    main()
