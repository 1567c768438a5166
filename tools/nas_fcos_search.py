"""NAS-FCOS's search (fcos_d2/modeling/nas_fcos/search/) on data-parallel workers:

    python tools/nas_fcos_search.py --num-workers 2 --output output/nas_fcos/search

takes the flags of ``python -m fcos_d2.modeling.nas_fcos.search`` and starts
``--num-workers`` (alias ``--num-gpus``) workers on this machine through
``fcos_d2.engine.launch`` (CPU processes over gloo where there is no CUDA; the proxy task
runs on the CPU either way). Each round, worker r trains sample r of the round; the main
worker updates the controller and writes the state, the records and ``best.yaml``.
``--resume`` continues a search with any number of workers. The search module may not
import the engine, so launching lives here.
"""
from datetime import timedelta
from typing import List, Optional

from fcos_d2.engine.launch import add_launcher_arguments, launch
from fcos_d2.modeling.nas_fcos.search import __main__ as nas_search  # fcos_d2 first: shims


def main(argv: Optional[List[str]] = None) -> None:
    args = add_launcher_arguments(nas_search.argument_parser()).parse_args(argv)
    launch(nas_search.search, args.num_workers, dist_url="auto", args=(args,),
           timeout=timedelta(seconds=args.dist_timeout),
           preemption_signals=args.preemption_signals, stall_timeout=args.stall_timeout)


if __name__ == "__main__":
    main()
