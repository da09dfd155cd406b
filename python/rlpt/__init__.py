# SPDX-License-Identifier: Apache-2.0
"""rlpt for PyTorch: rlpt's advantage estimators, policy objective and logprob/entropy kernels
as PyTorch custom operators (torch.ops.rlpt.*, with fake kernels and autograd formulas, so
torch.compile traces them), rank balancing and micro-batch plans (rlpt.balance,
rlpt.balance_partitions, rlpt.plan_microbatches), integrations for verl (rlpt.verl), TRL
(rlpt.trl) and OpenRLHF (rlpt.openrlhf), and the weight-sync sender / receiver (rlpt.sync). See
docs/python.md."""
import torch  # loads libtorch before the extension that links against it

from . import _C

_built = _C.torch_version.split("+")[0].split(".")[:2]
_running = torch.__version__.split("+")[0].split(".")[:2]
if _built != _running:
    raise ImportError(f"rlpt was built against torch {_C.torch_version} but torch {torch.__version__} is installed; "
                      "reinstall rlpt (pip install --force-reinstall --no-deps ./python)")

from ._errors import Error, error_id  # noqa: E402
from ._ops import (GROUP_STATS, METRICS, MISMATCH, TOKEN_STATS, Objective, areal_normalize, gae,  # noqa: E402
                   gigpo_advantages, gpg_advantages, group_ids, grpo_advantages, local_denominators, local_is_weights,
                   logprob_entropy, m2po_mask, metrics_dict, mismatch_metrics, opo_advantages, passk_advantages,
                   policy_loss, reinforce_pp, reinforce_pp_baseline, remax, rloo_advantages, sequence_logprob_entropy,
                   similar_anchor_ids, step_returns)
from ._rollout import balance, balance_partitions, plan_microbatches  # noqa: E402

if _C.lm_head:
    from ._ops import lm_head_isa, lm_head_logprob_entropy  # noqa: E402,F401

__version__ = "0.2.0"
cuda_kernels = bool(_C.cuda)


def set_strict(on=True):
    """Strict mode: a non-contiguous input is an error (rlpt.python.strides) instead of a counted copy."""
    _C.set_strict(bool(on))


def copy_stats():
    """{(kind, tensor name): count} of the copies ("copy") and dtype casts ("cast") the ops made
    of their inputs since the last reset_copy_stats()."""
    return {(k, n): c for k, n, c in _C.copy_stats()}


def reset_copy_stats():
    _C.reset_copy_stats()


__all__ = ["Error", "error_id", "Objective", "METRICS", "MISMATCH", "GROUP_STATS", "TOKEN_STATS", "metrics_dict",
           "policy_loss", "local_denominators", "local_is_weights", "m2po_mask", "mismatch_metrics",
           "logprob_entropy", "sequence_logprob_entropy", "grpo_advantages", "rloo_advantages", "opo_advantages",
           "gpg_advantages", "passk_advantages", "gigpo_advantages", "similar_anchor_ids", "step_returns", "gae", "reinforce_pp",
           "reinforce_pp_baseline", "remax", "group_ids", "areal_normalize", "set_strict", "copy_stats",
           "reset_copy_stats", "cuda_kernels", "balance", "balance_partitions", "plan_microbatches"]
if _C.lm_head:
    __all__ += ["lm_head_logprob_entropy", "lm_head_isa"]
