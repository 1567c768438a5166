"""FAD's architecture search (fcos_d2/modeling/fad/search.py), as a script:

    python tools/fad_search.py --config-file configs/FAD/FAD-tiny-search.yaml
    python tools/fad_search.py --config-file configs/FAD/FAD-tiny-search.yaml --resume

writes OUTPUT_DIR/genotype.log for ``train_net.py ... MODEL.FAD.GENOTYPE_FILE``. The same
as ``python -m fcos_d2.modeling.fad.search``.
"""
from fcos_d2.modeling.fad.search import run_from_command_line

if __name__ == "__main__":
    run_from_command_line()
