"""FAD's architecture search (fcos_d2/modeling/fad/search.py), as a script:

    python tools/fad_search.py --config-file configs/FAD/FAD-tiny-search.yaml
    python tools/fad_search.py --config-file configs/FAD/FAD-tiny-search.yaml --resume
    python tools/fad_search.py --num-gpus 2 --config-file configs/FAD/FAD-tiny-search.yaml

writes OUTPUT_DIR/genotype.log for ``train_net.py ... MODEL.FAD.GENOTYPE_FILE``. With
``--num-gpus N`` it starts N data-parallel workers through ``fcos_d2.engine.launch`` (one
per GPU, or N CPU processes over gloo where there is no CUDA); the search module may not
import the engine, so launching lives here. ``python -m fcos_d2.modeling.fad.search`` is
the same search in one process.
"""
from typing import List, Optional

from fcos_d2.engine.launch import add_launcher_arguments, launch_from_args
from fcos_d2.modeling.fad import search  # fcos_d2 first: its detectron2 compatibility shims


def main(argv: Optional[List[str]] = None) -> None:
    args = add_launcher_arguments(search.default_argument_parser()).parse_args(argv)
    launch_from_args(search.main, args)


if __name__ == "__main__":
    main()
