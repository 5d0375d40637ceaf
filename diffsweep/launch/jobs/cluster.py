"""What the Slurm cluster itself says about a plan, before anything is submitted (for
``diffsweep.launch.jobs.slurm_scheduler``): a controller answers, the partition exists, its nodes have
the GPUs a job asks for per node (``sinfo``), and the account and QoS are the user's
(``sacctmgr``, where accounting answers).

``launch`` checks all of it; ``plan`` checks the partition's GPUs, account and QoS when the
profile names a partition of the cluster it reaches (a profile of another cluster is planned,
not checked).
"""

from __future__ import annotations

import getpass
import re

from diffsweep import slurm
from diffsweep.config import ConfigError
from diffsweep.launch.plan import SweepPlan
from diffsweep.launch.profiles import Profile


def check_cluster(plan: SweepPlan) -> None:
    """Everything ``launch`` checks with Slurm; raises ConfigError naming the profile key."""
    slurm.check_controller()
    check_partition(plan.profile)
    check_gpus(plan)
    check_association(plan)


def check_planned(plan: SweepPlan) -> None:
    """What ``plan`` checks of a Slurm profile (``SlurmScheduler.check_plan``): the GPUs, account
    and QoS, if its partition is one of the reachable cluster's."""
    wanted = plan.profile.executor_params.get("partition")
    if wanted is not None and str(wanted) in slurm.partitions():
        check_gpus(plan)
        check_association(plan)


def check_partition(profile: Profile) -> None:
    """The profile's partition must exist (sbatch would refuse every array otherwise)."""
    wanted = profile.executor_params.get("partition")
    known = sorted(p for p in slurm.partitions() if p)
    if wanted is not None and known and str(wanted) not in known:
        raise ConfigError(profile.param_key("partition"), f"{wanted!r} is not a partition of this cluster; "
                          f"expected one of [{', '.join(known)}]")


_GPUS = re.compile(r"(?:^|,)gpu(?::[^:,()]+)?:(\d+)")


def gpus_per_node(gres: str) -> int:
    """The GPUs of a node from its ``sinfo %G`` GRES (``gpu:a100:4,gpu:v100:2`` has 6)."""
    return sum(int(n) for n in _GPUS.findall(gres))


def check_gpus(plan: SweepPlan) -> None:
    """No job may ask for more GPUs per node than the partition's nodes have: Slurm accepts such a
    job and leaves it pending forever."""
    need = max(plan.runs, key=lambda r: r.estimate.resources.gpus_per_node, default=None)
    if need is None or need.estimate.resources.gpus_per_node == 0:
        return
    wanted = str(plan.profile.executor_params.get("partition") or "")
    gres = slurm.partitions().get(wanted)
    if not gres:
        return  # sinfo did not answer, or an unknown partition (check_partition's)
    most = max(gpus_per_node(g) for g in gres)
    asked = need.estimate.resources.gpus_per_node
    if asked > most:
        where = f"partition {wanted}" if wanted else "the default partition"
        raise ConfigError(f"profile {plan.profile.name}: gpus_per_node", f"run {need.run.name} asks for {asked} GPUs "
                          f"per node, but the nodes of {where} have at most {most} (sinfo GRES: "
                          f"{', '.join(sorted(set(gres)))}); Slurm would leave its job pending forever")


def check_association(plan: SweepPlan) -> None:
    """The profile's account and QoS must be the user's, where ``sacctmgr`` answers (sbatch
    accepts unknown ones at sites that do not enforce associations; the jobs then fail or pend)."""
    account, qos = plan.profile.executor_params.get("account"), plan.profile.executor_params.get("qos")
    if account is None and qos is None:
        return
    user = getpass.getuser()
    rows = slurm.associations(user)
    if not rows:
        return  # no accounting here, or it does not answer: nothing to check against
    accounts = sorted({a for a, _ in rows if a})
    if account is not None and str(account) not in accounts:
        raise ConfigError(plan.profile.param_key("account"), f"{account!r} is not an account of user {user} on this "
                          f"cluster (sacctmgr); expected one of [{', '.join(accounts)}]")
    allowed = sorted({q for a, qs in rows if account is None or a == str(account) for q in qs.split(",") if q})
    if qos is not None and allowed and str(qos) not in allowed:
        of = f"account {account}" if account is not None else f"user {user}"
        raise ConfigError(plan.profile.param_key("qos"), f"{qos!r} is not a QoS of {of} on this cluster (sacctmgr); "
                          f"expected one of [{', '.join(allowed)}]")
