"""The family's contenders in the training-quality benchmark: FCOS's searched relatives
(NAS-FCOS, FAD) and detectron2's RetinaNet, on the recipe's trunk, data, optimizer,
schedule and evaluator, so that issue 50's and 51's side-by-side tables are rows of one
protocol beside ``fcos-d2 recipe`` (FCOS's head) and ``detectron2 faster-rcnn``.

What each changes on top of the recipe config (everything else, the ``MODEL.FCOS``
formulation included, is the recipe's, so a row differs from FCOS's by its FPN or head):

- ``nas-fcos fpn``: NAS-FCOS's FPN (published graph) under FCOS's head;
  ``nas-fcos fpn+head``: with the published head too. In these rows the published graph's
  deformable convs are separable 3x3 convs, as in ``configs/NAS-FCOS/quickstart.yaml``
  (torchvision's CPU ``deform_conv2d`` made them too slow when they ran); ``nas-fcos
  fpn+head dcn`` keeps them (the published genotype exactly), as do the rows of
  ``family_designed.py`` (the members as designed, issue 62).
- ``nas-fcos searched`` (and ``top-2``, ``random-1``, ``random-2``): the genotypes of
  ``genotypes/nas_fcos_*.yaml``, found by the search commands their files name, with their
  deformable convs separable 3x3 convs as the published graph's (``without_dcn``).
- ``fad paper``: FAD's towers with the paper's genotypes; ``fad searched``: the genotype
  of ``genotypes/fad_searched.log`` (written by the search its header names); ``fad
  random-1`` / ``random-2``: genotypes drawn from FAD's space
  (``fad.genotypes.random_genotype``). One cell a tower, as
  ``configs/FAD/FAD-tiny-train.yaml`` trains on a CPU (FAD: two, as in
  ``family_designed.py``'s two-cell rows), and 64 channels an edge
  (FAD: 96; the tiny config's 32 make GroupNorm(32) one channel a group, which fails on
  the recipe's 1x1 P7 at batch 1).
- ``detectron2 retinanet``: detectron2's RetinaNet on the same trunk and FPN levels, its
  anchors halved with the recipe's sizes of interest (16-256 px on P3-P7).
"""
import argparse
import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import yaml

from benchmarks.train_quality.contenders import (PROTOCOL_BEFORE_ISSUE_60, SGD_FP32, Contender,
                                                 FcosD2Contender)

GENOTYPES = Path(__file__).resolve().parent / "genotypes"
FCOS_HEAD = "fcos-d2 recipe"  # FCOS's head on FCOS's FPN: the reference row
NAS_FPN, NAS_HEAD, NAS_HEAD_DCN = "nas-fcos fpn", "nas-fcos fpn+head", "nas-fcos fpn+head dcn"
NAS_SEARCHED = "nas-fcos searched"
# name -> genotype file: the search's best, its second, and two of the random search's
NAS_GENOTYPE_FILES = {NAS_SEARCHED: "nas_fcos_searched.yaml",
                      "nas-fcos searched top-2": "nas_fcos_top2.yaml",
                      "nas-fcos random-1": "nas_fcos_random1.yaml",
                      "nas-fcos random-2": "nas_fcos_random2.yaml"}
FAD_PAPER, FAD_SEARCHED = "fad paper", "fad searched"
FAD_SEARCHED_FILE = "fad_searched.log"  # genotypes/: the tiny search's genotypes
FAD_RANDOM = {"fad random-1": 1, "fad random-2": 2}  # name -> random_genotype's seed
RETINANET = "detectron2 retinanet"
# The tables' order: the references, then each member's rows
FAMILY_ORDER = [FCOS_HEAD, "detectron2 faster-rcnn", RETINANET, NAS_FPN, NAS_HEAD, NAS_HEAD_DCN,
                *NAS_GENOTYPE_FILES, FAD_PAPER, FAD_SEARCHED, *FAD_RANDOM]

# The published NAS-FCOS graph with separable 3x3 convs in place of its deformable ones
# (configs/NAS-FCOS/quickstart.yaml), and the published head likewise
CPU_FPN_GENOTYPE = [[3, 3, "sep_conv_3x3", "sep_conv_3x3", "cat"],
                    [3, 3, "sep_conv_3x3", "sep_conv_3x3", "cat"],
                    [4, 3, "sep_conv_3x3", "skip_connect", "cat"],
                    [1, 3, "sep_conv_3x3", "skip_connect", "cat"],
                    [5, 3, "sep_conv_3x3", "sep_conv_3x3", "cat"],
                    [4, 7, "sep_conv_3x3", "sep_conv_3x3", "cat"],
                    [7, 2, "sep_conv_3x3", "sep_conv_3x3", "cat"]]
CPU_HEAD_GENOTYPE = ["sep_conv_3x3", "conv3x3", "sep_conv_3x3", "conv1x1", "skip_connect",
                     "skip_connect"]


def nas_fcos_overrides(fpn: Sequence, head: Sequence, share_index: int = 0,
                       channels: int = 128, protocol: Sequence = PROTOCOL_BEFORE_ISSUE_60
                       ) -> List:
    """The keys that make the recipe NAS-FCOS with genotype (`fpn`, `head`, `share_index`)
    at `channels` (default: the recipe's FPN width); ``head == []``: FCOS's head on the
    searched FPN. `protocol` comes first: this module's rows keep the one they were
    measured with (P3-P7, SGD, float32: ``PROTOCOL_BEFORE_ISSUE_60``), whatever the recipe
    config now sets; ``family_designed``'s take the recipe's solver on P3-P7."""
    return [*protocol, "MODEL.META_ARCHITECTURE", "NASFCOS",
            "MODEL.BACKBONE.NAME", "build_nas_fcos_backbone",
            "MODEL.RESNETS.OUT_FEATURES", ["res2", "res3", "res4", "res5"],
            "MODEL.NAS_FCOS.CHANNELS", channels,  # 128: the recipe's MODEL.FPN.OUT_CHANNELS
            "MODEL.NAS_FCOS.FPN_GENOTYPE", [list(c) for c in fpn],
            "MODEL.NAS_FCOS.HEAD_GENOTYPE", list(head),
            "MODEL.NAS_FCOS.HEAD_SHARE_INDEX", share_index,
            "MODEL.FCOS.TOP_BLOCKS_IN", "p5",  # P6/P7 from P5, as the recipe's FPN
            "MODEL.FCOS.CHANNELS_LAST", False]  # deform_conv2d takes NCHW


def read_nas_genotype(path: Path) -> Dict:
    """The ``FPN_GENOTYPE``, ``HEAD_GENOTYPE`` and ``HEAD_SHARE_INDEX`` of a genotype file
    (YAML; its ``source`` says which search found it)."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such genotype file (written from a NAS-FCOS "
                                "search's search_records.json; see its README)")
    value = yaml.safe_load(path.read_text())
    missing = [k for k in ("FPN_GENOTYPE", "HEAD_GENOTYPE", "HEAD_SHARE_INDEX") if k not in value]
    if missing:
        raise KeyError(f"{path}: missing keys {missing}")
    return value


def without_dcn(fpn: Sequence, head: Sequence):
    """The genotype (`fpn` cells, `head` operations) with every deformable conv a separable
    3x3 conv, as the published graph is trained on this CPU (``CPU_FPN_GENOTYPE``): a
    searched genotype's DCNs made a training iteration ~10x slower here (2.6 s against
    0.27 s)."""
    sep = {"def_conv_3x3": "sep_conv_3x3"}
    return ([[a, b, sep.get(o0, o0), sep.get(o1, o1), agg] for a, b, o0, o1, agg in fpn],
            [sep.get(op, op) for op in head])


class NASFCOSContender(FcosD2Contender):
    """NAS-FCOS (META_ARCH ``NASFCOS``) of a genotype on the recipe's trunk: given, or read
    from a genotype file when the contender first makes a config (so a missing file fails
    only the runs that need it; its deformable convs separable ones unless `dcn`);
    `extra`: further keys after the genotype's."""

    def __init__(self, name: str, genotype_file: str = "", fpn: Sequence = (),
                 head: Sequence = (), share_index: int = 0, dcn: bool = False,
                 extra: Sequence = (), protocol: Sequence = PROTOCOL_BEFORE_ISSUE_60):
        super().__init__(name, [*nas_fcos_overrides(fpn, head, share_index, protocol=protocol),
                                *extra] if fpn else ())
        self.genotype_file, self.dcn, self.extra = genotype_file, dcn, list(extra)
        self.protocol = list(protocol)

    def config(self, seed: int, output_dir: str, opts: Sequence = (), regime: str = "shapes",
               step: Sequence = ()):
        if self.genotype_file and not self.overrides:
            value = read_nas_genotype(GENOTYPES / self.genotype_file)
            fpn, head = value["FPN_GENOTYPE"], value["HEAD_GENOTYPE"]
            if not self.dcn:
                fpn, head = without_dcn(fpn, head)
            self.overrides = [*nas_fcos_overrides(fpn, head, value["HEAD_SHARE_INDEX"],
                                                  protocol=self.protocol), *self.extra]
        return super().config(seed, output_dir, opts, regime, step)


def fad_overrides(genotypes: Sequence = (), cells: int = 1,
                  protocol: Sequence = PROTOCOL_BEFORE_ISSUE_60) -> List:
    """The keys that make the recipe FAD (`cells` a tower: 1 as FAD-tiny-train.yaml, FAD's
    2; 64 channels an edge); `genotypes`: further keys choosing them (none: the paper's);
    `protocol` first, as ``nas_fcos_overrides`` (``()``: the recipe as shipped)."""
    return [*protocol, "MODEL.META_ARCHITECTURE", "FAD",
            "MODEL.FAD.NUM_CHANNELS_BOX", 64, "MODEL.FAD.NUM_CHANNELS_CLS", 64,
            "MODEL.FAD.NUM_CELLS_BOX", cells, "MODEL.FAD.NUM_CELLS_CLS", cells,
            "MODEL.FCOS.CHANNELS_LAST", False, *genotypes]


def fad_random_overrides(seed: int, cells: int = 1,
                         protocol: Sequence = PROTOCOL_BEFORE_ISSUE_60) -> List:
    """FAD with box and classification genotypes drawn from its space with `seed`
    (``random_genotype(3, seed)`` and ``(3, seed + 100)``), `cells` a tower, on `protocol`."""
    from fcos_d2.modeling.fad.genotypes import random_genotype, to_config_value

    return fad_overrides(["MODEL.FAD.GENO_BOX", to_config_value(random_genotype(3, seed)),
                          "MODEL.FAD.GENO_CLS", to_config_value(random_genotype(3, seed + 100))],
                         cells, protocol)


class RetinaNetContender(Contender):
    """detectron2's RetinaNet with FPN on the recipe's trunk (res3-res5 -> P3-P7, P6/P7
    from res5 as detectron2 builds them), with the protocol's data, optimizer, schedule and
    evaluator; its anchors are detectron2's halved (16-256 px, 3 scales, 3 ratios) as the
    recipe halves FCOS's sizes of interest for 128-px images."""

    def config(self, seed: int, output_dir: str, opts: Sequence = (), regime: str = "shapes",
               step: Sequence = ()):
        cfg = super().config(seed, output_dir, opts, regime, step).clone()
        cfg.defrost()
        cfg.merge_from_list(SGD_FP32)  # the family rows' protocol (PROTOCOL_BEFORE_ISSUE_60)
        cfg.merge_from_list(retinanet_overrides(cfg.MODEL.FCOS.NUM_CLASSES))
        cfg.merge_from_list(list(opts))
        cfg.freeze()
        return cfg

    def build(self, cfg):
        from detectron2.modeling import build_model

        return build_model(cfg)


def retinanet_overrides(num_classes: int) -> List:
    """The keys that turn the recipe config into detectron2's RetinaNet on its trunk."""
    sizes = [[s, s * 2 ** (1 / 3), s * 2 ** (2 / 3)] for s in (16, 32, 64, 128, 256)]
    return ["MODEL.META_ARCHITECTURE", "RetinaNet",
            "MODEL.BACKBONE.NAME", "build_retinanet_resnet_fpn_backbone",
            "MODEL.RESNETS.OUT_FEATURES", ["res3", "res4", "res5"],
            "MODEL.FPN.IN_FEATURES", ["res3", "res4", "res5"],
            "MODEL.RETINANET.IN_FEATURES", ["p3", "p4", "p5", "p6", "p7"],
            "MODEL.RETINANET.NUM_CLASSES", num_classes,
            "MODEL.ANCHOR_GENERATOR.SIZES", sizes,
            "MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS", [[0.5, 1.0, 2.0]]]


def family_contenders() -> List[Contender]:
    """Every family contender, in the tables' order."""
    nas = [NASFCOSContender(NAS_FPN, fpn=CPU_FPN_GENOTYPE, head=[]),
           NASFCOSContender(NAS_HEAD, fpn=CPU_FPN_GENOTYPE, head=CPU_HEAD_GENOTYPE),
           NASFCOSContender(NAS_HEAD_DCN, fpn=_published_fpn(), head=_published_head())]
    nas += [NASFCOSContender(name, genotype_file=file)
            for name, file in NAS_GENOTYPE_FILES.items()]
    fad = [FcosD2Contender(FAD_PAPER, fad_overrides()),
           FcosD2Contender(FAD_SEARCHED, fad_overrides(
               ["MODEL.FAD.GENOTYPE_FILE", str(GENOTYPES / FAD_SEARCHED_FILE)]))]
    fad += [FcosD2Contender(name, fad_random_overrides(seed)) for name, seed in FAD_RANDOM.items()]
    return [*nas, *fad, RetinaNetContender(RETINANET)]


def _published_fpn() -> List:
    from fcos_d2.modeling.nas_fcos.genotypes import PUBLISHED_FPN

    return PUBLISHED_FPN.to_config()


def _published_head() -> List:
    from fcos_d2.modeling.nas_fcos.genotypes import PUBLISHED_HEAD

    return list(PUBLISHED_HEAD.ops)


def nas_genotype_of_search(records_file: Path, fpn_sample: int, head_sample: int) -> Dict:
    """The genotype made of the FPN of sample `fpn_sample` and the head of sample
    `head_sample` of a NAS-FCOS search (its ``search_records.json``), with their rewards."""
    records = json.loads(Path(records_file).read_text())  # one record a sample
    chosen = {}
    for phase, sample in (("fpn", fpn_sample), ("head", head_sample)):
        found = [r for r in records if r["phase"] == phase and r["sample"] == sample]
        if not found:
            raise KeyError(f"{records_file}: no {phase} sample {sample}")
        chosen[phase] = found[0]
    return {**chosen["fpn"]["genotype"], **chosen["head"]["genotype"],
            "fpn_reward": chosen["fpn"]["reward"], "head_reward": chosen["head"]["reward"]}


def main(argv: Optional[List[str]] = None) -> None:
    """``python -m benchmarks.train_quality.family --records R --fpn-sample I --head-sample J
    --name NAME``: writes genotypes/NAME.yaml from a NAS-FCOS search's records."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--records", required=True, help="a search's search_records.json")
    parser.add_argument("--fpn-sample", type=int, required=True)
    parser.add_argument("--head-sample", type=int, required=True)
    parser.add_argument("--name", required=True, help="file stem under " + str(GENOTYPES))
    parser.add_argument("--source", required=True, help="the search command, for the header")
    args = parser.parse_args(argv)
    value = nas_genotype_of_search(Path(args.records), args.fpn_sample, args.head_sample)
    path = GENOTYPES / f"{args.name}.yaml"
    header = (f"# Written by python -m benchmarks.train_quality.family --fpn-sample "
              f"{args.fpn_sample} --head-sample {args.head_sample} from the records of:\n"
              f"#   {args.source}\n")
    path.write_text(header + yaml.safe_dump(value, default_flow_style=None, sort_keys=False))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
