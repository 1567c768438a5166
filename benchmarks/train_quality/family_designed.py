"""The family's members as designed (issue 62): rows that each change one thing.

Every row trains on the recipe as shipped (AdamW, bf16, ``configs/FCOS-R18-small-data.yaml``)
where ``family.py``'s rows keep the protocol of before issue 60 (SGD, float32). FAD's rows
take the recipe's levels too (P2-P4), so ``fcos-d2 recipe`` is their reference; NAS-FCOS's
FPN makes P3-P7, so its rows run on the recipe's solver at P3-P7 (``NAS_PROTOCOL``) and
``fcos-d2 recipe+p3-p7`` (FCOS's FPN and head on the same levels) is theirs.

On top of ``family.py``'s rows (one FAD cell a tower; NAS-FCOS without its deformable
convs), these keep what the authors train:

- ``fad paper two-cell`` (and ``fad searched two-cell``, ``fad searched-trained two-cell``,
  ``fad random-k two-cell``): FAD's two cells a tower. 64 channels an edge, as
  ``family.py``'s FAD rows, so that the row changes the cells only: FAD's ratio (96 of
  256) would give 48 at the recipe's 128, which GroupNorm(32) cannot split.
  ``searched-trained`` is the genotype of FAD's search at these levels (P2-P4) from a
  trained recipe (``genotypes/fad_searched_trained.yaml``; its command: configs/FAD/README.md);
  ``searched-trained ema-0.9`` that of the search as its config now is (the loss
  normalizer's momentum 0.9; from the float32 recipe:
  ``genotypes/fad_searched_trained_ema09.yaml``).
- ``nas-fcos fpn dcn``: the published FPN with its 12 deformable convs under FCOS's head;
  ``nas-fcos fpn+head dcn centerness-on-reg``: with the published head (4 more DCNs),
  centerness on its regression tower as FCOS's recipe predicts it, so that from ``fpn
  dcn`` it changes the towers only and against ``fpn+head dcn centerness-on-cls`` (the
  published model: the authors' placement, the classification tower) the placement only.
- ``... offset-lr-0.1``: those three rows with the deformable convs' offset predictors at
  0.1x the lr (``OFFSET_LR``): at AdamW's lr their offsets grew as long as P5-P7's maps
  are wide and sampled mostly padding (``python -m benchmarks.train_quality.offsets``).
- ``... offset-lr-0.1 96-channels``: the published model at 96 channels, under FCOS's
  GFLOPs on P3-P7 (128 channels give 1.15x them): the equal-FLOPs reading.
- ``nas-fcos fpn+head sep matched-params``: the published graph with separable 3x3 convs
  in place of its DCNs at width ``SEP_MATCHED_CHANNELS``, the multiple of 32 whose model
  has the parameters nearest the DCN model's (tested).
- ``nas-fcos searched dcn`` / ``searched-trained dcn`` / ``random-k dcn``: the searched
  genotypes with their DCNs kept (the operations the search chose), the search on the
  recipe's trained bottom-up (``genotypes/nas_fcos_searched_trained.yaml``, written by the
  command of configs/NAS-FCOS/README.md), and genotypes drawn uniformly from the space;
  their offsets at 0.1x the lr too.

A run of a base-lr DCN row with ``OFFSET_LR`` on its command line (the seed-0 pilots) is a
run of its ``offset-lr-0.1`` row: the two configs are equal (``counted_as``; tested).
"""
from typing import Dict, List, Tuple

from benchmarks.train_quality.contenders import P3_P7, Contender, FcosD2Contender
from benchmarks.train_quality.equal_time import other_than_schedule
from benchmarks.train_quality.family import (CPU_FPN_GENOTYPE, CPU_HEAD_GENOTYPE,
                                             FAD_SEARCHED_FILE, FCOS_HEAD, NASFCOSContender,
                                             fad_overrides, fad_random_overrides,
                                             _published_fpn, _published_head)

FAD_TWO_CELLS = 2  # FAD's cells a tower (MODEL.FAD.NUM_CELLS_BOX / CLS)
FAD_PAPER_TWO, FAD_SEARCHED_TWO = "fad paper two-cell", "fad searched two-cell"
FAD_SEARCHED_TRAINED_TWO = "fad searched-trained two-cell"
FAD_SEARCHED_TRAINED_FILE = "fad_searched_trained.yaml"
FAD_SEARCHED_EMA09_TWO = "fad searched-trained ema-0.9 two-cell"
FAD_SEARCHED_EMA09_FILE = "fad_searched_trained_ema09.yaml"
FAD_RANDOM_TWO = {f"fad random-{k} two-cell": k for k in range(1, 7)}  # random_genotype seed
# The recipe's solver and precision on NAS-FCOS's own levels (P3-P7, ranges [32, 64, 128, 256])
NAS_PROTOCOL = P3_P7
# ... with the deformable convs' offset predictors at 0.1x the lr: at AdamW's lr the offsets
# grew 3-7.5 feature pixels long on average on 4x4 and 8x8 maps, 74-87% of samples in the
# padding (docs/results/dcn_offsets.md)
OFFSET_LR = ["SOLVER.DEFORM_OFFSET_LR_FACTOR", 0.1]
NAS_DCN_PROTOCOL = [*P3_P7, *OFFSET_LR]
FAD_PROTOCOL: List = []  # the recipe as shipped (P2-P4)
FCOS_P3_P7 = "fcos-d2 recipe+p3-p7"  # the NAS-FCOS rows' reference: FCOS on their levels
NAS_FPN_DCN = "nas-fcos fpn dcn"
NAS_HEAD_DCN_CTR_CLS = "nas-fcos fpn+head dcn centerness-on-cls"  # the published model
NAS_HEAD_DCN_CTR_REG = "nas-fcos fpn+head dcn centerness-on-reg"
NAS_SEP_MATCHED = "nas-fcos fpn+head sep matched-params"
# The three DCN rows on NAS_DCN_PROTOCOL (the rows above keep the offsets at the base lr)
OFFSET_LR_ROWS = {name: f"{name} offset-lr-0.1"
                  for name in (NAS_FPN_DCN, NAS_HEAD_DCN_CTR_CLS, NAS_HEAD_DCN_CTR_REG)}
# The published model at FCOS's FLOPs on P3-P7: the widest multiple of 32 (GroupNorm(32))
# at most family_tables.EQUAL_FLOPS_TOLERANCE x FCOS's GFLOPs (96: 0.978 against 1.060; the
# 128 of the recipe's FPN gives 1.219)
NAS_EQUAL_FLOPS = "nas-fcos fpn+head dcn centerness-on-cls offset-lr-0.1 96-channels"
EQUAL_FLOPS_CHANNELS = 96
# 256: 15.03 M parameters against the DCN model's 15.30 M (224: 14.16 M, 288: 16.01 M)
SEP_MATCHED_CHANNELS = 256
NAS_SEARCHED_DCN, NAS_SEARCHED_TRAINED = "nas-fcos searched dcn", "nas-fcos searched-trained dcn"
NAS_RANDOM_DCN = {f"nas-fcos random-{k} dcn": k for k in range(1, 7)}  # draw seed
SEARCHED_TRAINED_FILE = "nas_fcos_searched_trained.yaml"
# The searched rows and the 4 random rows each is compared with at 3 seeds
# (benchmarks.train_quality.search_check compare); random rows 5 and 6 add architectures
# to the proxy check (>= 8 a space) only
SEARCH_COMPARISONS: Dict[str, List[str]] = {
    NAS_SEARCHED_TRAINED: list(NAS_RANDOM_DCN)[:4], NAS_SEARCHED_DCN: list(NAS_RANDOM_DCN)[:4],
    FAD_SEARCHED_TWO: list(FAD_RANDOM_TWO)[:4],
    FAD_SEARCHED_TRAINED_TWO: list(FAD_RANDOM_TWO)[:4],
    FAD_SEARCHED_EMA09_TWO: list(FAD_RANDOM_TWO)[:4]}
# The references of --contenders designed: FCOS on the recipe's levels and on NAS-FCOS's
REFERENCES = [FCOS_HEAD, FCOS_P3_P7]
# The rows of --contenders designed (the references are added first): the members as designed
MAIN_ROWS = [*OFFSET_LR_ROWS.values(), NAS_EQUAL_FLOPS, NAS_SEP_MATCHED, FAD_PAPER_TWO]
# The rows on NAS-FCOS's levels, read against FCOS_P3_P7 (the others against FCOS_HEAD)
NAS_DESIGNED = [NAS_FPN_DCN, NAS_HEAD_DCN_CTR_CLS, NAS_HEAD_DCN_CTR_REG,
                *OFFSET_LR_ROWS.values(), NAS_EQUAL_FLOPS, NAS_SEP_MATCHED, NAS_SEARCHED_DCN,
                NAS_SEARCHED_TRAINED, *NAS_RANDOM_DCN]
# The tables' order: the DCN rows at the base offset lr, the main rows, then the searched and
# random ones
DESIGNED_ORDER = [FCOS_P3_P7, *OFFSET_LR_ROWS, *MAIN_ROWS, NAS_SEARCHED_DCN,
                  NAS_SEARCHED_TRAINED, *NAS_RANDOM_DCN, FAD_SEARCHED_TWO,
                  FAD_SEARCHED_TRAINED_TWO, FAD_SEARCHED_EMA09_TWO, *FAD_RANDOM_TWO]


def reference_of(name: str) -> str:
    """The FCOS row that `name` is read against: FCOS on the same levels and solver."""
    return FCOS_P3_P7 if name in NAS_DESIGNED else FCOS_HEAD


def counted_as(record: dict) -> Tuple[str, Tuple[str, ...]]:
    """(row, overrides other than the schedule's) that a train_quality record counts for:
    a base-lr DCN row run with ``OFFSET_LR`` on its command line is a run of its
    ``OFFSET_LR_ROWS`` row, whose config is the same; any other run counts for its own."""
    name, rest = record["run"].get("contender"), other_than_schedule(record["overrides"])
    if name in OFFSET_LR_ROWS and rest == tuple(str(v) for v in OFFSET_LR):
        return OFFSET_LR_ROWS[name], ()
    return name, rest


def nas_random_genotype(seed: int, num_cells: int = 7, head_layers: int = 6
                        ) -> Tuple[List, List[str], int]:
    """(FPN cells, head operations, share index) drawn uniformly from the search's space
    (every operation, DCN included) with `seed`, as ``--random`` searches draw them."""
    import torch

    from fcos_d2.modeling.nas_fcos.search.controller import (
        fpn_decisions, fpn_from_actions, head_decisions, head_from_actions, sample_uniform)

    generator = torch.Generator().manual_seed(seed)
    _, fpn = sample_uniform(fpn_decisions(num_cells)[1], fpn_from_actions, generator)
    _, head = sample_uniform(head_decisions(head_layers)[1], head_from_actions, generator)
    return fpn.to_config(), list(head.ops), head.share_index


class RandomNASContender(NASFCOSContender):
    """NAS-FCOS of ``nas_random_genotype(seed)``, drawn when it first makes a config."""

    def __init__(self, name: str, seed: int):
        super().__init__(name, dcn=True, protocol=NAS_DCN_PROTOCOL)
        self.seed = seed

    def config(self, seed: int, output_dir: str, opts=(), regime: str = "shapes", step=()):
        if not self.overrides:
            fpn, head, share = nas_random_genotype(self.seed)
            from benchmarks.train_quality.family import nas_fcos_overrides

            self.overrides = nas_fcos_overrides(fpn, head, share, protocol=NAS_DCN_PROTOCOL)
        return super().config(seed, output_dir, opts, regime, step)


def designed_contenders() -> List[Contender]:
    """The rows of this module (``fcos-d2 recipe+p3-p7`` is a recipe variant)."""
    from benchmarks.train_quality.family import GENOTYPES

    def nas(name, protocol=NAS_DCN_PROTOCOL, **kwargs):
        return NASFCOSContender(name, protocol=protocol, **kwargs)

    ctr_on_reg = ["MODEL.NAS_FCOS.CENTERNESS_ON_REG", True]
    dcn_rows = [(NAS_FPN_DCN, {"fpn": _published_fpn(), "head": []}),
                (NAS_HEAD_DCN_CTR_CLS, {"fpn": _published_fpn(), "head": _published_head()}),
                (NAS_HEAD_DCN_CTR_REG, {"fpn": _published_fpn(), "head": _published_head(),
                                        "extra": ctr_on_reg})]
    nas_rows = [
        *(nas(name, NAS_PROTOCOL, **genotype) for name, genotype in dcn_rows),
        *(nas(OFFSET_LR_ROWS[name], **genotype) for name, genotype in dcn_rows),
        nas(NAS_EQUAL_FLOPS, fpn=_published_fpn(), head=_published_head(),
            extra=["MODEL.NAS_FCOS.CHANNELS", EQUAL_FLOPS_CHANNELS]),
        nas(NAS_SEP_MATCHED, NAS_PROTOCOL, fpn=CPU_FPN_GENOTYPE, head=CPU_HEAD_GENOTYPE,
            extra=["MODEL.NAS_FCOS.CHANNELS", SEP_MATCHED_CHANNELS]),
        nas(NAS_SEARCHED_DCN, genotype_file="nas_fcos_searched.yaml", dcn=True),
        nas(NAS_SEARCHED_TRAINED, genotype_file=SEARCHED_TRAINED_FILE, dcn=True),
        *(RandomNASContender(name, seed) for name, seed in NAS_RANDOM_DCN.items())]
    fad = [FcosD2Contender(FAD_PAPER_TWO, fad_overrides(cells=FAD_TWO_CELLS,
                                                        protocol=FAD_PROTOCOL))]
    fad += [FcosD2Contender(name, fad_overrides(["MODEL.FAD.GENOTYPE_FILE", str(GENOTYPES / file)],
                                                cells=FAD_TWO_CELLS, protocol=FAD_PROTOCOL))
            for name, file in ((FAD_SEARCHED_TWO, FAD_SEARCHED_FILE),
                               (FAD_SEARCHED_TRAINED_TWO, FAD_SEARCHED_TRAINED_FILE),
                               (FAD_SEARCHED_EMA09_TWO, FAD_SEARCHED_EMA09_FILE))]
    fad += [FcosD2Contender(name, fad_random_overrides(seed, FAD_TWO_CELLS, FAD_PROTOCOL))
            for name, seed in FAD_RANDOM_TWO.items()]
    return [*nas_rows, *fad]
