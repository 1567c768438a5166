"""``python -m benchmarks.speed``: the command of ``benchmarks.speed.cli``."""
from benchmarks.speed.cli import main

if __name__ == "__main__":
    main()
