"""FAD (Zhong et al., ECCV 2020, "Representation Sharing for Fast Object Detector Search
and Beyond") on the FCOS core: the search space, the supernet and its search, the searched
head. Importing it registers the meta-architectures "FAD" and "FADSearch" and the
``MODEL.FAD`` node."""
from . import config  # noqa: F401  (side effect: registers MODEL.FAD and SOLVER.ARCH_*)
from .cells import DerivedCell, SearchCell, derive_genotype
from .genotypes import (PAPER_BOX, PAPER_CLS, PRIMITIVES, Genotype, read_genotype_file,
                        write_genotype_file)
from .head import FADHead
from .meta_arch import FAD, FADSearch
from .ops import MixedOp, RepShare, build_op
from .supernet import FADSearchHead, architecture_parameters, weight_parameters

__all__ = ["DerivedCell", "SearchCell", "derive_genotype", "PAPER_BOX", "PAPER_CLS",
           "PRIMITIVES", "Genotype", "read_genotype_file", "write_genotype_file", "FADHead",
           "FAD", "FADSearch", "MixedOp", "RepShare", "build_op", "FADSearchHead",
           "architecture_parameters", "weight_parameters"]
