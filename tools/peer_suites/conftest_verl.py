# SPDX-License-Identifier: Apache-2.0
"""conftest for verl's own tests (tools/peer_suites/run): rlpt.verl.patch() puts rlpt's functions in
verl's registries and its get_seqlen_balanced_partitions into verl.utils.seqlen_balancing, and every
compute_* name rlpt.verl defines replaces verl's in verl.trainer.ppo.core_algos before the test
modules import them."""
import rlpt.verl as rv
from verl.trainer.ppo import core_algos as ca

rv.patch()
SWAPPED = sorted(n for n in dir(rv) if n.startswith("compute_") and hasattr(ca, n))
for _name in SWAPPED:
    setattr(ca, _name, getattr(rv, _name))


def pytest_report_header(config):
    from verl.utils import seqlen_balancing as sb

    assert sb.get_seqlen_balanced_partitions is rv.get_seqlen_balanced_partitions
    return ("rlpt in verl.trainer.ppo.core_algos: " + ", ".join(SWAPPED)
            + "; in verl.utils.seqlen_balancing: get_seqlen_balanced_partitions")
