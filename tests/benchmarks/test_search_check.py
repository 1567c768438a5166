"""Do the searches earn their cost (benchmarks/train_quality/search_check.py): Kendall's
tau on hand-made rewards and APs against hand-computed values, FAD's supernet score of a
genotype, the searched-against-random verdict and the tau read from records."""
import json
import math

import pytest

from benchmarks.train_quality import search_check
from benchmarks.train_quality.family_designed import FAD_RANDOM_TWO, FAD_SEARCHED_TWO
from fcos_d2.modeling.fad.genotypes import PRIMITIVES, make_genotype


def test_kendall_tau_on_hand_made_rewards_and_aps():
    # pairs of (1,3,2,4) against (1,2,3,4): 5 concordant, 1 discordant (2-3): 4 / 6
    assert search_check.kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    assert search_check.kendall_tau([-3.0, -2.0, -1.0], [2.0, 4.0, 9.0]) == 1.0
    assert search_check.kendall_tau([3, 2, 1], [1, 2, 3]) == -1.0
    # a tie in x: pairs (1,2) tied, (1,3) and (2,3) concordant: 2 / sqrt((3 - 1) * 3)
    assert search_check.kendall_tau([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / math.sqrt(6))
    assert math.isnan(search_check.kendall_tau([1, 1], [1, 2]))  # constant rewards
    with pytest.raises(ValueError, match="same length >= 2, got 3 and 2"):
        search_check.kendall_tau([1, 2, 3], [1, 2])


def test_fad_score_sums_the_mixing_weights_of_the_chosen_edges():
    genotype = make_genotype([[[PRIMITIVES[0], 0], [PRIMITIVES[2], 1]]])  # one node
    node = [[0.0] * len(PRIMITIVES) for _ in range(2)]  # (2 sources, primitives)
    node[0][0], node[1][2], node[1][0] = 0.5, 0.25, 9.0  # 9.0: an edge not chosen
    mixing = {"box": [node], "cls": [node]}
    assert search_check.fad_genotype_score({"box": genotype, "cls": genotype}, mixing) == 1.5


def _run(name, seed, ap, iterations=4800):
    return {"seed": seed, "metrics": {"AP": ap}, "overrides": [],
            "run": {"contender": name, "iterations": iterations, "status": "ok"}}


def test_the_searched_row_beats_random_only_by_more_than_its_seeds_std():
    randoms = list(FAD_RANDOM_TWO)[:4]
    quality = [_run(FAD_SEARCHED_TWO, s, ap) for s, ap in ((0, 10.0), (1, 12.0), (2, 14.0))]
    quality += [_run(name, s, 9.0) for name in randoms for s in range(3)]
    quality.append(_run(randoms[0], 1, 99.0, iterations=600))  # another schedule: not read
    lines = search_check.compare(quality, FAD_SEARCHED_TWO, randoms, 4800)
    assert lines[0] == f"| {FAD_SEARCHED_TWO} | 0, 1, 2 | 12.0 / 2.0 |"
    assert lines[-1].startswith(f"{FAD_SEARCHED_TWO} beats the mean of 4 random")
    assert lines[-1].endswith("+3.0 AP against std 2.0")
    one_seed = [r for r in quality if r["run"]["contender"] != randoms[1] or r["seed"] == 0]
    one_seed_lines = search_check.compare(one_seed, FAD_SEARCHED_TWO, randoms, 4800)
    assert one_seed_lines[-1].endswith(
        f"std 2.0 (provisional: {randoms[1]} at fewer than 3 seeds)")
    assert one_seed_lines[2] == f"| {randoms[1]} | 0 | 9.0 / - |"  # one seed: no std
    single = [r for r in quality if r["run"]["contender"] != FAD_SEARCHED_TWO or r["seed"] == 0]
    assert search_check.compare(single, FAD_SEARCHED_TWO, randoms, 4800)[-1] == (
        f"not decided: {FAD_SEARCHED_TWO} has one seed, so no std to beat the random mean by "
        "(+1.0 AP)")
    close = [_run(FAD_SEARCHED_TWO, s, ap) for s, ap in ((0, 8.0), (1, 12.0))] + quality[3:]
    assert "does not beat" in search_check.compare(close, FAD_SEARCHED_TWO, randoms, 4800)[-1]
    assert search_check.compare(quality[:4], FAD_SEARCHED_TWO, randoms, 4800)[-1].startswith(
        "not decided")  # one random row only


def test_tau_lines_pair_rewards_with_trained_ap_and_judge_the_target():
    rewards = [{"metrics": {"reward": r}, "run": {"contender": n, "member": "fad"}}
               for n, r in (("a", -1.0), ("b", -2.0), ("c", -3.0), ("a", -4.0))]  # a's latest
    quality = [_run("a", 0, 1.0), _run("b", 0, 3.0), _run("c", 0, 2.0)]
    lines = search_check.tau_lines(quality, rewards, "fad", 4800)
    assert lines[:3] == ["| a | -4.0000 | 1.0 | 0 |", "| b | -2.0000 | 3.0 | 0 |",
                         "| c | -3.0000 | 2.0 | 0 |"]
    described = search_check.tau_lines(quality, rewards, "fad", 4800, lambda n: n.upper(),
                                       {"a": 3.0, "b": 2.0, "c": 1.0}.get)
    assert described[0] == "| a | -4.0000 | 1.0 | 0 | A | 3.000 |"
    # GFLOPs a > b > c against AP b > c > a: pairs a-b, a-c discordant, b-c concordant
    assert described[-1] == "GFLOPs as the reward: Kendall tau -0.33"
    # rewards b > c > a against AP b > c > a: tau 1, but 3 architectures decide nothing
    assert lines[-1] == ("Kendall tau over 3 architectures: 1.00 (target 0.4: not decided: "
                         "3 of the 8 architectures needed)")
    assert search_check.tau_lines(quality, rewards, "nas-fcos", 4800)[-1].startswith("tau: needs")
    names = [f"r{k}" for k in range(8)]  # reward k
    eight = [{"metrics": {"reward": float(k)}, "run": {"contender": n, "member": "fad"}}
             for k, n in enumerate(names)]
    aps = [1.0, 0.0, 3.0, 2.0, 5.0, 4.0, 7.0, 6.0]  # 4 of 28 pairs discordant: 20 / 28
    trained = [_run(n, 0, ap) for n, ap in zip(names, aps)]
    assert search_check.tau_lines(trained, eight, "fad", 4800)[-1] == \
        "Kendall tau over 8 architectures: 0.71 (target 0.4: met)"
    reversed_aps = [_run(n, 0, -ap) for n, ap in zip(names, aps)]
    assert search_check.tau_lines(reversed_aps, eight, "fad", 4800)[-1].endswith("missed)")


def test_the_mean_ap_reads_schedule_only_runs_and_the_offset_lr_pilots():
    from benchmarks.train_quality.family_designed import NAS_FPN_DCN, OFFSET_LR_ROWS

    schedule = ["SOLVER.MAX_ITER", "4200"]
    pilot = {**_run(NAS_FPN_DCN, 0, 50.0, 4200),
             "overrides": schedule + ["SOLVER.DEFORM_OFFSET_LR_FACTOR", "0.1"]}
    fp32 = {**_run(NAS_FPN_DCN, 1, 10.0, 4200), "overrides": schedule + ["MODEL.DTYPE", "fp32"]}
    quality = [pilot, fp32, _run(NAS_FPN_DCN, 2, 20.0, 4200),
               _run(OFFSET_LR_ROWS[NAS_FPN_DCN], 1, 52.0, 4200)]
    slow = search_check.mean_ap(quality, OFFSET_LR_ROWS[NAS_FPN_DCN], 4200)
    assert slow["seeds"] == [0, 1] and slow["ap"] == 51.0
    base = search_check.mean_ap(quality, NAS_FPN_DCN, 4200)  # neither the pilot nor fp32
    assert base["seeds"] == [2] and base["ap"] == 20.0


def test_the_nas_rows_architecture_reads_their_strides_and_dcns_from_their_genotypes():
    from benchmarks.train_quality.family_designed import (NAS_HEAD_DCN_CTR_CLS, NAS_RANDOM_DCN,
                                                          nas_random_genotype)
    from fcos_d2.modeling.nas_fcos.genotypes import parse_fpn_genotype

    # the published FPN: 12 DCNs (its 7 cells but 2 skips); its head: 2
    assert search_check.nas_architecture(NAS_HEAD_DCN_CTR_CLS) == "P3-P5 at 8, 8, 32; DCNs 12 + 2"
    name, seed = next(iter(NAS_RANDOM_DCN.items()))
    fpn, head, _ = nas_random_genotype(seed)
    strides = parse_fpn_genotype(fpn).native_strides()
    dcns = sum(op == "def_conv_3x3" for cell in fpn for op in cell[2:4])
    assert search_check.nas_architecture(name) == (
        f"P3-P5 at {', '.join(map(str, strides))}; DCNs {dcns} + {head.count('def_conv_3x3')}")


def test_the_comparison_command_trains_the_searched_and_random_rows_at_3_seeds():
    command = search_check.training_command(FAD_SEARCHED_TWO, 4800, 4000, 400)
    assert command.count("two-cell'") == 5 and "--seeds 0 1 2" in command
    assert command.endswith("SOLVER.MAX_ITER 4800 SOLVER.STEPS '(4000,)' SOLVER.WARMUP_ITERS 400")


def test_fad_rewards_score_each_rows_genotypes_on_the_searchs_final_weights(tmp_path):
    import json

    from benchmarks.train_quality.family_designed import FAD_PAPER_TWO
    from fcos_d2.modeling.fad.genotypes import PAPER_BOX, PAPER_CLS

    def weights(value):  # 3 nodes: (2, 3, 4 sources) x primitives, all `value`
        return [[[value] * len(PRIMITIVES) for _ in range(i + 2)] for i in range(3)]

    history = [{"iteration": 1, "box": weights(9.0), "cls": weights(9.0)},
               {"iteration": 2, "box": weights(0.5), "cls": weights(0.25)}]
    (tmp_path / "alphas.json").write_text(json.dumps({"primitives": PRIMITIVES,
                                                      "history": history}))
    found = search_check.fad_rewards([FAD_PAPER_TWO], tmp_path / "alphas.json")
    edges = sum(len(node) for node in PAPER_BOX.nodes)  # 6 edges a tower
    assert edges == sum(len(node) for node in PAPER_CLS.nodes) == 6
    assert found == {FAD_PAPER_TWO: 6 * 0.5 + 6 * 0.25}  # the last entry's weights


def test_the_speedup_is_recorded_with_both_wall_times(tmp_path, monkeypatch):
    monkeypatch.setenv("FCOS_D2_RECORDS_DIR", str(tmp_path))
    monkeypatch.setattr(search_check, "speedup", lambda member, workers, scale: {1: 30.0, 2: 20.0})
    search_check.main(["speedup", "--member", "fad", "--scale", "3"])
    (record,) = [json.loads(line) for line in
                 (tmp_path / "search_speedup.jsonl").read_text().splitlines()]
    assert record["metrics"] == {"seconds_1_worker": 30.0, "seconds_2_workers": 20.0,
                                 "speedup": 1.5}
    assert record["run"] == {"member": "fad", "workers": 2, "scale": 3}


def test_seeds_from_a_cpu_without_native_bf16_are_marked_and_can_be_left_out():
    def run(name, seed, ap, flags):
        return {**_run(name, seed, ap), "cpu": {"model": "CPU", "flags": flags}}

    randoms = list(FAD_RANDOM_TWO)[:4]
    quality = [run(FAD_SEARCHED_TWO, 0, 10.0, ["avx512_bf16"]),
               run(FAD_SEARCHED_TWO, 1, 14.0, []), run(FAD_SEARCHED_TWO, 2, 12.0, [])]
    quality += [run(name, 0, 9.0, ["avx512_bf16"]) for name in randoms]
    lines = search_check.compare(quality, FAD_SEARCHED_TWO, randoms, 4800)
    assert lines[0] == f"| {FAD_SEARCHED_TWO} | 0, 1*, 2* | 12.0 / 2.0 |"
    assert lines[1] == f"| {randoms[0]} | 0 | 9.0 / - |"
    assert lines[-2].startswith("* trained on a CPU without native bf16")
    assert lines[-1].endswith("(CPUs of both kinds: see the mark)")
    native = search_check.compare(quality, FAD_SEARCHED_TWO, randoms, 4800, "native-bf16")
    assert native[0] == f"| {FAD_SEARCHED_TWO} | 0 | 10.0 / - |"  # seeds 1-2 left out
    assert native[-1].startswith("not decided") and not any("*" in x for x in native)
    without = search_check.compare(quality, FAD_SEARCHED_TWO, randoms, 4800, "without-bf16")
    assert without[0] == f"| {FAD_SEARCHED_TWO} | 1, 2 | 13.0 / 1.4 |"
    assert without[1] == f"| {randoms[0]} | - | no runs at 4800 iterations |"
    rewards = [{"metrics": {"reward": r}, "run": {"contender": n, "member": "fad"}}
               for n, r in ((FAD_SEARCHED_TWO, 2.0), (randoms[0], 1.0))]
    tau = search_check.tau_lines(quality, rewards, "fad", 4800)
    assert tau[0] == f"| {FAD_SEARCHED_TWO} | 2.0000 | 12.0 | 0, 1*, 2* |"
    assert tau[2].startswith("* trained on a CPU without native bf16")
    assert search_check.tau_lines(quality, rewards, "fad", 4800, cpu="native-bf16")[0] == (
        f"| {FAD_SEARCHED_TWO} | 2.0000 | 10.0 | 0 |")
