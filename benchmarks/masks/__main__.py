"""``python -m benchmarks.masks``: the command of ``benchmarks.masks.cli``."""
from benchmarks.masks.cli import main

if __name__ == "__main__":
    main()
