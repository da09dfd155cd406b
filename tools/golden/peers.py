"""Peer frameworks in the golden-vector venv: versions, metadata, and import checks.

`python tools/golden/peers.py` verifies that every peer entry point the generators rely on
imports, then prints the installed versions (setup-venv runs it last).
"""
import importlib
import importlib.metadata
import importlib.util
import pathlib
import sys
import types

PEERS = ("torch", "numpy", "transformers", "safetensors", "verl", "trl", "openrlhf", "deepspeed")


def versions() -> dict[str, str | None]:
    """Installed version of each peer package (None if absent)."""
    found = {}
    for name in PEERS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def meta(generator: str, seed: int, **params) -> dict:
    """Metadata block for a golden file: generator name, seed, peer versions, parameters."""
    return {"generator": generator, "seed": seed, "peers": versions(), "params": params}


def openrlhf_models(submodule: str) -> types.ModuleType:
    """Import openrlhf.models.<submodule> without running openrlhf/models/__init__.py.

    That __init__ imports flash_attn (a CUDA-only source build) and peft; loss.py and utils.py
    themselves need only torch and deepspeed.
    """
    if "openrlhf.models" not in sys.modules:
        root = pathlib.Path(importlib.util.find_spec("openrlhf").submodule_search_locations[0])
        package = types.ModuleType("openrlhf.models")
        package.__path__ = [str(root / "models")]
        sys.modules["openrlhf.models"] = package
    return importlib.import_module(f"openrlhf.models.{submodule}")


def check() -> None:
    """Import the peer entry points the generators use; raise ImportError naming any that is missing."""
    import trl.trainer.grpo_trainer as trl_grpo
    import trl.trainer.utils as trl_utils
    import verl.trainer.ppo.core_algos as verl_algos

    import areal.utils.functional as areal_functional

    required = {
        verl_algos: ("compute_grpo_outcome_advantage", "compute_gae_advantage_return",
                     "compute_policy_loss_vanilla", "kl_penalty", "agg_loss",
                     "POLICY_LOSS_REGISTRY", "ADV_ESTIMATOR_REGISTRY"),
        trl_grpo.GRPOTrainer: ("_compute_loss", "_generate_and_score_completions"),
        trl_utils: ("selective_log_softmax", "entropy_from_logits", "nanstd"),
        openrlhf_models("loss"): ("PolicyLoss", "ValueLoss"),
        areal_functional: ("ppo_actor_loss_fn", "sapo_loss_fn", "apply_rejection_sampling"),
    }
    missing = [f"{owner.__name__}.{name}" for owner, names in required.items() for name in names
               if not hasattr(owner, name)]
    if missing:
        raise ImportError(f"peer entry points missing: {missing}")


if __name__ == "__main__":
    check()
    for name, version in versions().items():
        print(f"{name:14} {version}")
    # Not in PEERS, whose versions every golden file's metadata lists: AReaL's cases record theirs.
    print(f"{'areal':14} {importlib.metadata.version('areal')}")
