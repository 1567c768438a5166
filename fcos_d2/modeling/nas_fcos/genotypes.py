"""NAS-FCOS genotypes: the typed, validated description of a searched FPN and head.

An FPN genotype is a sequence of cells. The pool of features a cell may read starts with
the backbone's C2-C5 adapted to one width (indices 0-3) and grows by one per cell: cell
``i``'s output is pool index ``4 + i``. Each cell reads two pool entries, applies one
operation to each at its own resolution, and aggregates the pair at the finer one. The
outputs no later cell reads ("unused") make the pyramid: the last three are P5, P4 and
P3, in that order, and each earlier unused output is added to all three.

A head genotype is a sequence of operations applied in both the classification and the
regression tower, with a share index: layers below it have separate weights per level.

In a config these are plain lists (``MODEL.NAS_FCOS.FPN_GENOTYPE``, ``HEAD_GENOTYPE``),
read by :func:`parse_fpn_genotype` / :func:`parse_head_genotype`; nothing is ``eval``'d.
"""
from dataclasses import dataclass
from typing import List, Sequence, Tuple

# The operations and aggregations of the search spaces, in the order of the NAS-FCOS code
# (its genotypes store indices into these lists; :func:`fpn_genotype_from_indices`).
FPN_OPS: Tuple[str, ...] = ("sep_conv_3x3", "sep_conv_3x3_dil3", "sep_conv_5x5_dil6",
                            "skip_connect", "def_conv_3x3")
FPN_AGGREGATIONS: Tuple[str, ...] = ("psum", "cat")
HEAD_OPS: Tuple[str, ...] = ("conv1x1", "conv3x3", "sep_conv_3x3", "sep_conv_3x3_dil3",
                             "skip_connect", "def_conv_3x3")
NUM_INPUTS = 4  # C2-C5, pool indices 0-3
MIN_UNUSED = 3  # P3, P4, P5: the NAS-FCOS code rejects genotypes with fewer


@dataclass(frozen=True)
class FPNCell:
    """One cell: pool indices read, the operation on each, and how the pair is merged."""
    inputs: Tuple[int, int]
    ops: Tuple[str, str]
    aggregation: str


@dataclass(frozen=True)
class FPNGenotype:
    cells: Tuple[FPNCell, ...]

    def unused(self) -> List[int]:
        """Pool indices of the cell outputs no later cell reads, in cell order."""
        read = {index for cell in self.cells for index in cell.inputs}
        return [NUM_INPUTS + i for i in range(len(self.cells)) if NUM_INPUTS + i not in read]

    def native_strides(self, input_strides: Sequence[int] = (4, 8, 16, 32)) -> List[int]:
        """The strides at which P3, P4 and P5 are computed before the FPN resizes them to
        C3-C5's (8, 16, 32 on a ResNet): a cell works at the finer of its inputs' strides
        (``input_strides``: C2-C5's), so that a P3 made at 16 is upsampled and a P5 made at
        8 is subsampled by bilinear interpolation."""
        strides = list(input_strides)
        for cell in self.cells:
            strides.append(min(strides[i] for i in cell.inputs))
        return [strides[i] for i in self.unused()[-3:]][::-1]

    def describe(self) -> str:
        """One line per output, e.g. ``P5 = f8 + f6``."""
        unused = self.unused()
        extra = "".join(f" + f{i}" for i in unused[:-3])
        return ", ".join(f"{name} = f{i}{extra}" for name, i in zip(("P5", "P4", "P3"),
                                                                   unused[-3:]))

    def to_config(self) -> List[list]:
        """The list ``MODEL.NAS_FCOS.FPN_GENOTYPE`` holds."""
        return [[c.inputs[0], c.inputs[1], c.ops[0], c.ops[1], c.aggregation]
                for c in self.cells]


@dataclass(frozen=True)
class HeadGenotype:
    ops: Tuple[str, ...]
    share_index: int = 0

    def to_config(self) -> Tuple[List[str], int]:
        """(``MODEL.NAS_FCOS.HEAD_GENOTYPE``, ``MODEL.NAS_FCOS.HEAD_SHARE_INDEX``)."""
        return list(self.ops), self.share_index


class GenotypeError(ValueError):
    """A genotype that does not describe a buildable FPN or head."""


def validate_fpn_genotype(genotype: FPNGenotype, key: str = "MODEL.NAS_FCOS.FPN_GENOTYPE"
                          ) -> FPNGenotype:
    """Returns ``genotype`` or raises GenotypeError naming ``key``, the cell and the fault."""
    if not genotype.cells:
        raise GenotypeError(f"{key}: no cells; give a list of [in0, in1, op0, op1, aggregation]")
    for i, cell in enumerate(genotype.cells):
        where = f"{key}: cell {i} {list(cell.inputs) + list(cell.ops) + [cell.aggregation]}"
        pool = NUM_INPUTS + i
        for index in cell.inputs:
            if not 0 <= index < pool:
                raise GenotypeError(f"{where}: input {index} is not in the pool 0..{pool - 1} "
                                    f"(0-3: C2-C5, then one output per earlier cell)")
        for op in cell.ops:
            if op not in FPN_OPS:
                raise GenotypeError(f"{where}: unknown operation '{op}', expected one of "
                                    f"{FPN_OPS}")
        if cell.aggregation not in FPN_AGGREGATIONS:
            raise GenotypeError(f"{where}: unknown aggregation '{cell.aggregation}', expected "
                                f"one of {FPN_AGGREGATIONS}")
    unused = genotype.unused()
    if len(unused) < MIN_UNUSED:
        raise GenotypeError(f"{key}: only {len(unused)} cell outputs ({unused}) are read by no "
                            f"later cell; P3-P5 need at least {MIN_UNUSED}")
    return genotype


def validate_head_genotype(genotype: HeadGenotype, key: str = "MODEL.NAS_FCOS.HEAD_GENOTYPE"
                           ) -> HeadGenotype:
    """Returns ``genotype`` or raises GenotypeError naming ``key`` and the fault."""
    for op in genotype.ops:
        if op not in HEAD_OPS:
            raise GenotypeError(f"{key}: unknown operation '{op}', expected one of {HEAD_OPS}")
    if not 0 <= genotype.share_index <= len(genotype.ops):
        raise GenotypeError(f"MODEL.NAS_FCOS.HEAD_SHARE_INDEX: {genotype.share_index} is not "
                            f"in 0..{len(genotype.ops)} (the layers of {key})")
    return genotype


def parse_fpn_genotype(value: Sequence[Sequence], key: str = "MODEL.NAS_FCOS.FPN_GENOTYPE"
                       ) -> FPNGenotype:
    """An FPN genotype from its config list ``[[in0, in1, op0, op1, aggregation], ...]``."""
    cells = []
    for i, cell in enumerate(value):
        if len(cell) != 5 or not all(isinstance(x, int) for x in cell[:2]) \
                or not all(isinstance(x, str) for x in cell[2:]):
            raise GenotypeError(f"{key}: cell {i} is {list(cell)}; expected [input index, input "
                                f"index, operation, operation, aggregation]")
        cells.append(FPNCell((cell[0], cell[1]), (cell[2], cell[3]), cell[4]))
    return validate_fpn_genotype(FPNGenotype(tuple(cells)), key)


def parse_head_genotype(ops: Sequence[str], share_index: int,
                        key: str = "MODEL.NAS_FCOS.HEAD_GENOTYPE") -> HeadGenotype:
    """A head genotype from its config values (operation names, share index)."""
    if not all(isinstance(op, str) for op in ops):
        raise GenotypeError(f"{key}: {list(ops)}; expected operation names {HEAD_OPS}")
    return validate_head_genotype(HeadGenotype(tuple(ops), int(share_index)), key)


def fpn_genotype_from_indices(cells: Sequence[Sequence[int]]) -> FPNGenotype:
    """The genotype of the NAS-FCOS code's ``[[in0, in1, op0, op1, agg], ...]`` indices."""
    return validate_fpn_genotype(FPNGenotype(tuple(
        FPNCell((a, b), (FPN_OPS[o0], FPN_OPS[o1]), FPN_AGGREGATIONS[agg])
        for a, b, o0, o1, agg in cells)))


def head_genotype_from_indices(ops: Sequence[int], share_index: int) -> HeadGenotype:
    """The genotype of the NAS-FCOS code's head indices and share layer."""
    return validate_head_genotype(HeadGenotype(tuple(HEAD_OPS[i] for i in ops), share_index))


# The published genotype (the NAS-FCOS configs' SEARCH.DECODER.CONFIG): seven cells, all
# deformable or identity operations merged by "cat"; P5 = f8 + f6, P4 = f9 + f6,
# P3 = f10 + f6. The published head: share index 0 (every layer shared across levels).
PUBLISHED_FPN = fpn_genotype_from_indices(
    [[3, 3, 4, 4, 1], [3, 3, 4, 4, 1], [4, 3, 4, 3, 1], [1, 3, 4, 3, 1], [5, 3, 4, 4, 1],
     [4, 7, 4, 4, 1], [7, 2, 4, 4, 1]])
PUBLISHED_HEAD = head_genotype_from_indices([5, 1, 5, 0, 4, 4], 0)
