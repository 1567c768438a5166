"""FAD's genotypes: the file forms, their checks, and the derivation rule."""
import pytest
import torch

from fcos_d2.modeling.fad.cells import derive_genotype
from fcos_d2.modeling.fad.genotypes import (PAPER_BOX, PAPER_CLS, PRIMITIVES, Edge,
                                            from_config_value, make_genotype, parse_line,
                                            random_genotype,
                                            read_genotype_file, to_config_value,
                                            write_genotype_file)

# The box genotype as FAD's README prints it.
README_BOX = ("Genotype(normal=[[('sinSep_conv_3x3_x3', 0), ('std_conv_3x3_x3', 1)], "
              "[('std_conv_3x3', 2), ('sinSep_conv_3x3+dil_conv_3x3', 1)], "
              "[('sinSep_conv_3x3_x2', 2), ('std_conv_3x3_x2', 3)]], normal_concat=range(2, 5))")


def test_fad_readme_line_parses_to_the_paper_box_genotype():
    genotype = parse_line(README_BOX)
    assert genotype == PAPER_BOX
    assert genotype.nodes[1] == (Edge("std_conv_3x3", 2), Edge("sinSep_conv_3x3+dil_conv_3x3", 1))
    assert genotype.concat == (2, 3, 4)


@pytest.mark.parametrize("suffix", [".log", ".yaml"])
def test_genotype_file_round_trip(tmp_path, suffix):
    path = tmp_path / f"genotype{suffix}"
    write_genotype_file(path, PAPER_BOX, PAPER_CLS)
    assert read_genotype_file(path) == (PAPER_BOX, PAPER_CLS)


def test_log_file_is_fad_two_line_format(tmp_path):
    write_genotype_file(tmp_path / "genotype.log", PAPER_BOX, PAPER_CLS)
    lines = (tmp_path / "genotype.log").read_text().splitlines()
    assert lines[0] == README_BOX
    assert len(lines) == 2


def test_config_value_round_trip():
    value = to_config_value(PAPER_CLS)
    assert value[0] == [["sinSep_conv_3x3_x2+dil_conv_3x3", 1], ["std_conv_3x3_x3", 0]]
    assert from_config_value(value) == PAPER_CLS


def test_a_line_is_never_evaluated():
    with pytest.raises(ValueError, match="not a FAD genotype line"):
        parse_line("__import__('os').system('true')")
    with pytest.raises(ValueError, match="not a literal"):
        parse_line("Genotype(normal=[[(open('x'), 0)]], normal_concat=range(2, 3))")


@pytest.mark.parametrize("nodes, message", [
    ([[("sep_conv_3x3", 0)]], "node 0: unknown operation 'sep_conv_3x3'"),
    ([[("none", 0)]], "node 0: unknown operation 'none'"),
    ([[("std_conv_3x3", 2)]], r"node 0: source 2 is not one of the 2 states before it"),
    ([[("std_conv_3x3", 0)], []], "node 1 has no edges"),
])
def test_invalid_genotypes_are_refused_naming_the_node(nodes, message):
    with pytest.raises(ValueError, match=message):
        make_genotype(nodes, what="MODEL.FAD.GENO_BOX")


def test_missing_file_names_the_key(tmp_path):
    with pytest.raises(FileNotFoundError, match="MODEL.FAD.GENOTYPE_FILE: no file"):
        read_genotype_file(tmp_path / "nothing.log")


def test_derivation_on_hand_set_weights():
    p = len(PRIMITIVES)
    op = {name: i for i, name in enumerate(PRIMITIVES)}
    node0 = torch.full((2, p), 0.01)
    node0[0, op["std_conv_3x3_x2"]] = 0.3
    node0[1, op["sinSep_conv_3x3"]] = 0.5
    node1 = torch.full((3, p), 0.01)
    node1[0, op["none"]] = 0.9  # "none" never counts: edge 0's best other op is 0.2
    node1[0, op["std_conv_3x3"]] = 0.2
    node1[1, op["std_conv_3x3_x3"]] = 0.1
    node1[2, op["sinSep_conv_3x3_x2+dil_conv_3x3"]] = 0.4
    genotype = derive_genotype([node0, node1])
    assert genotype.nodes == (
        (Edge("sinSep_conv_3x3", 1), Edge("std_conv_3x3_x2", 0)),
        (Edge("sinSep_conv_3x3_x2+dil_conv_3x3", 2), Edge("std_conv_3x3", 0)),
    )
    assert genotype.concat == (2, 3)


def test_derivation_refuses_weights_of_the_wrong_shape():
    with pytest.raises(ValueError, match=r"node 0 weights have shape \(3, 11\)"):
        derive_genotype([torch.zeros(3, len(PRIMITIVES))])


def test_random_genotypes_are_valid_seeded_and_use_distinct_sources():
    first, again, other = random_genotype(3, seed=0), random_genotype(3, seed=0), \
        random_genotype(3, seed=1)
    assert first == again and first != other
    for i, node in enumerate(first.nodes):
        sources = [edge.source for edge in node]
        assert len(set(sources)) == 2 and all(0 <= s < i + 2 for s in sources)
        assert all(edge.op != "none" for edge in node)
