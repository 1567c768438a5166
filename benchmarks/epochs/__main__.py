"""``python -m benchmarks.epochs``: the command of ``benchmarks.epochs.cli``."""
from benchmarks.epochs.cli import main

if __name__ == "__main__":
    main()
