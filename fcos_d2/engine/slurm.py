"""Launch settings from SLURM's environment, for scripts started by ``srun``.

fcos-d2 expects **one srun task per node** (``srun --ntasks-per-node=1``): as with
detectron2's ``launch``, that task spawns the node's workers, one per GPU. So under srun:

* ``--num-machines``  <- ``SLURM_STEP_NUM_NODES`` (the step's nodes),
* ``--machine-rank``  <- ``SLURM_NODEID`` (this node's index in the step),
* ``--num-gpus``      <- ``SLURM_GPUS_ON_NODE`` (the GPUs SLURM gave this node; not set
  without ``--gpus-per-node`` / ``--gres``, and then the flag or its default 1 counts),
* ``--dist-url``      <- ``tcp://<first host of SLURM_STEP_NODELIST>:<port>``, the port
  being ``$MASTER_PORT`` if set, else one derived from ``SLURM_JOB_ID`` (all nodes of a
  job compute the same; a requeued job keeps its id and so its port).

A flag given on the command line wins over the environment; for the first three a flag
that disagrees with SLURM is an error naming both values (it would start a job whose
workers wait for each other forever). Several tasks per node are refused with an error
that says how to start the job.

Node lists use SLURM's compressed syntax: ``gpu[01-03,07],login1,rack[1-2]-n[3-4]``;
``expand_nodelist`` reads it (no ``scontrol`` needed on the nodes).
"""
import argparse
import itertools
import re
from typing import Dict, List, Mapping, Optional, Sequence

__all__ = ["SlurmError", "apply_slurm_environment", "expand_nodelist", "job_port",
           "slurm_launch_settings"]

# SLURM_JOB_ID -> port: a range above the usual services and below the ephemeral ports.
_PORT_BASE, _PORT_RANGE = 15000, 20000


def job_port(job_id: str) -> int:
    """The rendezvous port of a job: the same on every node of it and after a requeue (a
    requeued job keeps its id). ``"4242"`` -> 19242; an array job's ``"4242_3"`` -> 19242."""
    digits = re.match(r"\d+", job_id)
    if digits is None:
        raise SlurmError(f"job id {job_id!r} does not start with a number; set MASTER_PORT")
    return _PORT_BASE + int(digits.group()) % _PORT_RANGE


class SlurmError(ValueError):
    """SLURM's environment and the command line disagree, or cannot be read."""


def expand_nodelist(nodelist: str) -> List[str]:
    """The host names of a SLURM node list, in order.

    ``"gpu[01-03,07],login1"`` -> ``["gpu01", "gpu02", "gpu03", "gpu07", "login1"]``;
    ranges keep their zero padding; several bracket groups in one name give every
    combination (``"r[1-2]-n[3-4]"`` -> r1-n3, r1-n4, r2-n3, r2-n4).

    Raises:
        SlurmError: an unbalanced bracket or a range that is not ``low-high``, naming it.
    """
    hosts: List[str] = []
    for name in _split_top_level(nodelist):
        parts = re.split(r"(\[[^\]]*\])", name)  # text, [ranges], text, ...
        if any("[" in text or "]" in text for text in parts[::2]):  # outside the groups
            raise SlurmError(f"node list {nodelist!r}: unbalanced brackets in {name!r}")
        choices = [_expand_ranges(p[1:-1], nodelist) if p.startswith("[") else [p]
                   for p in parts]
        hosts += ["".join(combination) for combination in itertools.product(*choices)]
    return hosts


def _split_top_level(nodelist: str) -> List[str]:
    """Splits at the commas outside brackets."""
    names, depth, current = [], 0, ""
    for char in nodelist.strip():
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            names.append(current)
            current = ""
        else:
            current += char
    return [name for name in names + [current] if name]


def _expand_ranges(ranges: str, nodelist: str) -> List[str]:
    """``"01-03,07"`` -> ``["01", "02", "03", "07"]``."""
    values = []
    for item in ranges.split(","):
        low, _, high = item.partition("-")
        if not low.isdigit() or not (high or low).isdigit() or int(high or low) < int(low):
            raise SlurmError(f"node list {nodelist!r}: cannot read the range {item!r}")
        width = len(low)
        values += [str(n).zfill(width) for n in range(int(low), int(high or low) + 1)]
    return values


def slurm_launch_settings(environ: Mapping[str, str]) -> Optional[Dict[str, object]]:
    """What the environment of an ``srun`` task says about the launch, or None outside srun.

    Returns:
        ``{"num_machines", "machine_rank", "dist_url"}`` and, where SLURM gave GPUs to the
        node, ``"num_gpus"``.

    Raises:
        SlurmError: several tasks on a node, or a missing or unreadable variable.
    """
    if "SLURM_STEP_NUM_NODES" not in environ:  # set by srun, not by sbatch or salloc
        return None
    nodes = _integer(environ, "SLURM_STEP_NUM_NODES")
    tasks = _integer(environ, "SLURM_STEP_NUM_TASKS") if "SLURM_STEP_NUM_TASKS" in environ \
        else nodes
    if tasks != nodes:
        raise SlurmError(
            f"srun started {tasks} tasks on {nodes} nodes (SLURM_STEP_NUM_TASKS={tasks}, "
            f"SLURM_STEP_NUM_NODES={nodes}): fcos-d2 expects one task per node, which "
            "spawns one worker per GPU, as detectron2's launch does. Start it with "
            "`srun --ntasks-per-node=1 ...` (see tools/slurm/train.sbatch).")
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST", "")
    if not nodelist:
        raise SlurmError("under srun, but neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST "
                         "is set: pass --dist-url tcp://HOST:PORT")
    if "MASTER_PORT" in environ:
        port = _integer(environ, "MASTER_PORT")
    else:
        port = job_port(str(_integer(environ, "SLURM_JOB_ID")))
    settings: Dict[str, object] = {
        "num_machines": nodes, "machine_rank": _integer(environ, "SLURM_NODEID"),
        "dist_url": f"tcp://{expand_nodelist(nodelist)[0]}:{port}"}
    if environ.get("SLURM_GPUS_ON_NODE"):
        settings["num_gpus"] = _integer(environ, "SLURM_GPUS_ON_NODE")
    return settings


def _integer(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except KeyError:
        raise SlurmError(f"under srun, but {name} is not set") from None
    except ValueError:
        raise SlurmError(f"{name}={environ[name]!r} is not an integer") from None


# flag -> SLURM variable it comes from; a disagreement names both.
_SOURCES = {"num_machines": ("--num-machines", "SLURM_STEP_NUM_NODES"),
            "machine_rank": ("--machine-rank", "SLURM_NODEID"),
            "num_gpus": ("--num-gpus", "SLURM_GPUS_ON_NODE"),
            "dist_url": ("--dist-url", "SLURM_STEP_NODELIST")}


def apply_slurm_environment(parser: argparse.ArgumentParser, argv: Optional[Sequence[str]],
                            environ: Mapping[str, str]) -> argparse.Namespace:
    """Parses ``argv`` with ``parser`` (detectron2's ``default_argument_parser``); under
    srun, fills the launch flags that were not given from SLURM's environment.

    Raises:
        SlurmError: a given ``--num-machines``, ``--machine-rank`` or ``--num-gpus`` that
            differs from SLURM's value (a given ``--dist-url`` simply wins).
    """
    settings = slurm_launch_settings(environ)
    if settings is None:
        return parser.parse_args(argv)
    given = _given_options(parser, argv, list(settings))
    args = parser.parse_args(argv)
    for dest, value in settings.items():
        flag, variable = _SOURCES[dest]
        if dest not in given:
            setattr(args, dest, value)
        elif dest != "dist_url" and getattr(args, dest) != value:
            raise SlurmError(f"{flag} {getattr(args, dest)} disagrees with SLURM's environment "
                             f"({variable}={environ[variable]} says {value}): leave the flag "
                             "out under srun, or make the allocation match it")
    return args


def _given_options(parser: argparse.ArgumentParser, argv: Optional[Sequence[str]],
                   dests: List[str]) -> List[str]:
    """The ``dests`` whose flags ``argv`` gives (in any spelling argparse accepts)."""
    missing = object()
    defaults = {dest: parser.get_default(dest) for dest in dests}
    parser.set_defaults(**{dest: missing for dest in dests})
    try:
        parsed = parser.parse_args(argv)
    finally:
        parser.set_defaults(**defaults)
    return [dest for dest in dests if getattr(parsed, dest) is not missing]
