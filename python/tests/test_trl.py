# SPDX-License-Identifier: Apache-2.0
"""rlpt.trl.GRPOTrainer inside a real TRL GRPOTrainer run on the CPU (a tiny random Qwen2 model and a
word-level tokenizer made here: nothing is downloaded): at the first step the rlpt loss and its
gradients equal TRL's own _compute_loss on the same generated batch, for every loss type rlpt
covers; then 20 steps with rlpt's loss raise the reward on a trivial verifiable task."""
import os

import pytest
import torch

pytest.importorskip("trl")
os.environ.setdefault("WANDB_DISABLED", "true")

from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM  # noqa: E402
from trl import GRPOConfig  # noqa: E402
from trl import GRPOTrainer as TRLGRPOTrainer  # noqa: E402

import rlpt.trl  # noqa: E402

VOCAB = {"<pad>": 0, "<eos>": 1, "a": 2, "b": 3, "c": 4, "d": 5, "q": 6}


def tokenizer():
    tok = Tokenizer(models.WordLevel(vocab=VOCAB, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def tiny_model(path, seed=0):
    """A random tiny Qwen2 saved under `path` (TRL loads the reference model from the same path)."""
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=len(VOCAB), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64, pad_token_id=0,
                      eos_token_id=1, bos_token_id=1)
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    tokenizer().save_pretrained(path)
    return str(path)


def reward_a(completions, **kwargs):
    """Fraction of 'a' tokens: a task a policy can learn in a few steps."""
    return [c.split().count("a") / 8.0 for c in completions]


def dataset(n=64):
    return Dataset.from_dict({"prompt": ["q a", "q b", "q c", "q d"] * (n // 4)})


def config(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[], per_device_train_batch_size=8,
                num_generations=4, max_completion_length=8, logging_steps=1, save_strategy="no", seed=0,
                learning_rate=3e-3, disable_tqdm=True)
    base.update(kw)
    return GRPOConfig(**base)


def assert_same_losses(checks):
    """Each (rlpt's loss, TRL's loss, rlpt's gradients, TRL's gradients) agree to float32 rounding."""
    for ours, theirs, g1, g2 in checks:
        assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-7), (float(ours), float(theirs))
        for a, b in zip(g1, g2):
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-7), float((a - b).abs().max())


class Checking(rlpt.trl.GRPOTrainer):
    """At every step: rlpt's loss and gradients next to TRL's own on the same inputs."""

    checks = None

    def _compute_loss(self, model, inputs):
        params = [p for p in model.parameters() if p.requires_grad]
        ours = super()._compute_loss(model, inputs)
        assert self.rlpt_loss_used == "rlpt"
        theirs = TRLGRPOTrainer._compute_loss(self, model, inputs)
        g1 = torch.autograd.grad(ours, params, retain_graph=True)
        g2 = torch.autograd.grad(theirs, params, retain_graph=True)
        self.checks.append((ours.detach(), theirs.detach(), g1, g2))
        return ours


@pytest.mark.parametrize("loss_type,extra", [
    ("grpo", {}), ("bnpo", {}), ("dr_grpo", {}), ("dapo", {}), ("cispo", {"epsilon_high": 4.0}), ("sapo", {}),
    ("grpo", {"beta": 0.05, "epsilon_high": 0.28}), ("dapo", {"importance_sampling_level": "sequence"}),
    ("bnpo", {"entropy_coef": 0.01, "gradient_accumulation_steps": 2}),
    ("luspo", {"importance_sampling_level": "sequence", "beta": 0.05}),
    ("vespo", {"vespo_k_pos": 1.5}),
    ("grpo", {"top_entropy_quantile": 0.5}),
    ("dapo", {"top_entropy_quantile": 0.3, "importance_sampling_level": "sequence", "beta": 0.05}),
    ("cispo", {"top_entropy_quantile": 0.6, "epsilon_high": 4.0}),
    # sampling log-probs are the old ones here (no vLLM): a sequence KL of 0, over a threshold of -1,
    # so every negative-advantage sequence is dropped
    ("bnpo", {"off_policy_mask_threshold": -1.0, "beta": 0.05}),
    ("sapo", {"off_policy_mask_threshold": -1.0, "top_entropy_quantile": 0.5}),
    ("sapo", {"importance_sampling_level": "sequence"}),
    ("sapo", {"importance_sampling_level": "sequence", "top_entropy_quantile": 0.5, "beta": 0.05}),
    # the KL times the sequence ratio (1 at the first step: the plumbing; the golden cases test the values)
    ("grpo", {"importance_sampling_level": "sequence", "beta": 0.05, "use_bias_correction_kl": True}),
    ("cispo", {"importance_sampling_level": "sequence", "epsilon_high": 4.0}),
    # vespo at sequence level is the token-level loss; TRL's default bias-corrected KL weighs the KL
    # by the sequence ratio
    ("vespo", {"importance_sampling_level": "sequence", "beta": 0.05, "use_bias_correction_kl": False}),
    ("vespo", {"importance_sampling_level": "sequence", "beta": 0.05}),
    # the bonus over the high-entropy tokens only, its mean over them
    ("grpo", {"top_entropy_quantile": 0.5, "entropy_coef": 0.05}),
    ("dapo", {"top_entropy_quantile": 0.3, "entropy_coef": 0.1, "gradient_accumulation_steps": 2, "beta": 0.05}),
])
def test_first_step_equals_trl(tmp_path, loss_type, extra):
    steps = 2 if extra.get("gradient_accumulation_steps") else 1
    args = config(tmp_path, loss_type=loss_type, max_steps=1, **extra)
    tr = Checking(model=tiny_model(tmp_path / "model"), reward_funcs=reward_a, args=args, train_dataset=dataset(),
                  processing_class=tokenizer())
    tr.checks = []
    tr.train()
    assert len(tr.checks) == steps
    assert_same_losses(tr.checks)


def reward_tied_on_a(completions, prompts, **kwargs):
    """Tied (0.5) for every completion of the prompts with an 'a', else reward_a: degenerate groups."""
    return [0.5 if "a" in p.split() else c.split().count("a") / 8.0 for p, c in zip(prompts, completions)]


class CheckingDegenerate(rlpt.trl.GRPOTrainer):
    """rlpt_degenerate_groups='exclude' against TRL's own loss on the same inputs, rescaled by what the
    switch changes: B / B' for the per-sequence normalisers, N / N' for bnpo, nothing for the loss
    types that divide by num_items_in_batch (already counted without the degenerate groups)."""

    checks = None
    seen = None

    def _compute_loss(self, model, inputs):
        params = [p for p in model.parameters() if p.requires_grad]
        keep = inputs["rlpt_in_denominator"]
        mask = inputs["completion_mask"]
        ours = super()._compute_loss(model, inputs)
        theirs = TRLGRPOTrainer._compute_loss(self, model, inputs)
        if self.loss_type in ("grpo", "sapo", "dr_grpo", "luspo"):
            scale = keep.numel() / max(int(keep.sum()), 1)
        elif self.loss_type == "bnpo":
            scale = float(mask.sum()) / max(float((mask * keep.unsqueeze(1)).sum()), 1.0)
        else:
            scale = 1.0
        if int(keep.sum()) == 0 and self.loss_type not in ("dapo", "cispo", "vespo"):
            scale = 0.0  # nothing left to divide by: a zero loss
        self.seen.append((int(keep.sum()), keep.numel()))
        theirs = theirs * scale
        g1 = torch.autograd.grad(ours, params, retain_graph=True)
        g2 = torch.autograd.grad(theirs, params, retain_graph=True)
        self.checks.append((ours.detach(), theirs.detach(), g1, g2))
        return ours


@pytest.mark.parametrize("loss_type,extra", [
    ("grpo", {"beta": 0.05}), ("bnpo", {}), ("dr_grpo", {}), ("dapo", {"beta": 0.05}), ("cispo", {"epsilon_high": 4.0}),
    ("luspo", {"importance_sampling_level": "sequence"}), ("sapo", {}),
    ("dapo", {"gradient_accumulation_steps": 2}),
])
def test_degenerate_groups_out_of_the_denominator(tmp_path, loss_type, extra):
    args = config(tmp_path, loss_type=loss_type, max_steps=3, per_device_train_batch_size=16, **extra)
    tr = CheckingDegenerate(model=tiny_model(tmp_path / "model"), reward_funcs=reward_tied_on_a, args=args,
                            train_dataset=dataset(), processing_class=tokenizer(), rlpt_degenerate_groups="exclude")
    tr.checks, tr.seen = [], []
    tr.train()
    assert_same_losses(tr.checks)
    # the seeded run has micro-batches with some groups tied and some not
    assert any(0 < k < n for k, n in tr.seen), tr.seen


def test_degenerate_groups_switch_checks_its_value(tmp_path):
    args = config(tmp_path, loss_type="dapo", max_steps=1)
    with pytest.raises(rlpt.Error) as e:
        rlpt.trl.GRPOTrainer(model=tiny_model(tmp_path / "model"), reward_funcs=reward_a, args=args,
                             train_dataset=dataset(), processing_class=tokenizer(), rlpt_degenerate_groups="drop")
    assert e.value.id == "rlpt.python.bad_option" and "'drop'" in e.value.message
    args = config(tmp_path, loss_type="dapo", max_steps=1, multi_objective_aggregation="normalize_then_sum")
    with pytest.raises(rlpt.Error, match="sum_then_normalize"):
        rlpt.trl.GRPOTrainer(model=tiny_model(tmp_path / "model"), reward_funcs=reward_a, args=args,
                             train_dataset=dataset(), processing_class=tokenizer(), rlpt_degenerate_groups="exclude")


class CheckingVLLMRatio(Checking):
    """Checking with a vLLM importance-sampling ratio in the batch, as TRL's vLLM generation adds
    (no vLLM here: the ratio is made up, and use_vllm is on only inside the loss)."""

    zero_frac = 0.0  # the share of ratios set to 0, as TRL's token_mask does outside its band

    def _compute_loss(self, model, inputs):
        g = torch.Generator().manual_seed(5)
        inputs = dict(inputs)
        shape = inputs["completion_mask"].shape
        ratio = 0.5 + torch.rand(shape, generator=g)
        ratio = ratio.masked_fill(torch.rand(shape, generator=g) < self.zero_frac, 0.0)
        # 1 outside the completion, as TRL's exp((old - sampling) * mask): VESPO sums every position's log
        inputs["importance_sampling_ratio"] = torch.where(inputs["completion_mask"].bool(), ratio, 1.0)
        self.use_vllm, self.vllm_importance_sampling_correction = True, True
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self.use_vllm = False


@pytest.mark.parametrize("loss_type,extra", [
    ("grpo", {}), ("dapo", {"importance_sampling_level": "sequence", "top_entropy_quantile": 0.5}),
    ("cispo", {"epsilon_high": 4.0, "beta": 0.05}),
    # VESPO folds the ratio into its sequence weight (a 0 ratio as log 1e-8)
    ("vespo", {"vllm_importance_sampling_mode": "token_truncate"}),
    ("vespo", {"vllm_importance_sampling_mode": "token_mask", "vespo_k_pos": 1.5, "zero_frac": 0.05}),
])
def test_first_step_with_vllm_ratio_equals_trl(tmp_path, loss_type, extra):
    extra = dict(extra)
    zero_frac = extra.pop("zero_frac", 0.0)
    args = config(tmp_path, loss_type=loss_type, max_steps=1, **extra)
    tr = CheckingVLLMRatio(model=tiny_model(tmp_path / "model"), reward_funcs=reward_a, args=args,
                           train_dataset=dataset(), processing_class=tokenizer())
    tr.zero_frac = zero_frac
    tr.checks = []
    tr.train()
    assert len(tr.checks) == 1
    assert_same_losses(tr.checks)


class CheckingToolMask(Checking):
    """Checking with a `tool_mask` in the batch, as TRL's tool calling adds (0 on the tokens a tool
    returned, which stay out of every sum): here a seeded run of zeros in every other completion."""

    def _compute_loss(self, model, inputs):
        g = torch.Generator().manual_seed(7)
        inputs = dict(inputs)
        b, t = inputs["completion_mask"].shape
        tool = torch.ones(b, t, dtype=inputs["completion_mask"].dtype)
        for row in range(0, b, 2):
            start = int(torch.randint(0, max(t - 1, 1), (1,), generator=g))
            tool[row, start:start + int(torch.randint(1, t + 1, (1,), generator=g))] = 0
        inputs["tool_mask"] = tool
        return super()._compute_loss(model, inputs)


@pytest.mark.parametrize("loss_type,extra", [
    ("grpo", {}), ("dapo", {"beta": 0.05}), ("dr_grpo", {"entropy_coef": 0.05}),
    ("sapo", {"importance_sampling_level": "sequence", "top_entropy_quantile": 0.5}),
    ("vespo", {}), ("bnpo", {"off_policy_mask_threshold": -1.0}),
])
def test_first_step_with_tool_mask_equals_trl(tmp_path, loss_type, extra):
    args = config(tmp_path, loss_type=loss_type, max_steps=1, **extra)
    tr = CheckingToolMask(model=tiny_model(tmp_path / "model"), reward_funcs=reward_a, args=args,
                          train_dataset=dataset(), processing_class=tokenizer())
    tr.checks = []
    tr.train()
    assert len(tr.checks) == 1
    assert_same_losses(tr.checks)


def test_twenty_steps_raise_the_reward(tmp_path):
    args = config(tmp_path, loss_type="dapo", max_steps=20, learning_rate=2e-2, per_device_train_batch_size=16,
                  num_generations=8, temperature=1.0)
    tr = rlpt.trl.GRPOTrainer(model=tiny_model(tmp_path / "model", 1), reward_funcs=reward_a, args=args, train_dataset=dataset(320),
                              processing_class=tokenizer())
    tr.train()
    assert tr.rlpt_loss_used == "rlpt"
    rewards = [h["reward"] for h in tr.state.log_history if "reward" in h]
    assert len(rewards) == 20
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.1, rewards


class VLLMRatioOnly(rlpt.trl.GRPOTrainer):
    """A vLLM ratio of 1 in the batch with use_vllm on inside the loss only (TRL refuses vespo with a
    sequence-level vLLM mode when the trainer is made with use_vllm)."""

    def _compute_loss(self, model, inputs):
        inputs = dict(inputs, importance_sampling_ratio=torch.ones_like(inputs["completion_mask"], dtype=torch.float32))
        self.use_vllm, self.vllm_importance_sampling_correction = True, True
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self.use_vllm = False


def test_unsupported_configuration_falls_back_to_trl(tmp_path):
    args = config(tmp_path, loss_type="vespo", max_steps=1, vllm_importance_sampling_mode="sequence_mask")
    tr = VLLMRatioOnly(model=tiny_model(tmp_path / "model"), reward_funcs=reward_a, args=args,
                       train_dataset=dataset(), processing_class=tokenizer())
    with pytest.warns(UserWarning, match="vespo with vllm_importance_sampling_mode sequence_mask"):
        tr.train()
    assert tr.rlpt_loss_used == "trl"


class CheckingAdaptive(Checking):
    """Checking for the adaptive entropy controller, whose state each loss moves: TRL's loss runs
    from the state rlpt's started from, and both must leave the same state."""

    states = None

    def _controller(self):
        w = self._entropy_window_stats
        return self.entropy_coef, self._last_world_entropy, None if w is None else w.clone()

    def _compute_loss(self, model, inputs):
        params = [p for p in model.parameters() if p.requires_grad]
        start = self._controller()
        ours = rlpt.trl.GRPOTrainer._compute_loss(self, model, inputs)
        assert self.rlpt_loss_used == "rlpt"
        after_ours = self._controller()
        self.entropy_coef, self._last_world_entropy, self._entropy_window_stats = start
        theirs = TRLGRPOTrainer._compute_loss(self, model, inputs)
        self.states.append((after_ours, self._controller()))
        g1 = torch.autograd.grad(ours, params, retain_graph=True)
        g2 = torch.autograd.grad(theirs, params, retain_graph=True)
        self.checks.append((ours.detach(), theirs.detach(), g1, g2))
        return ours


@pytest.mark.parametrize("extra", [
    # entropy stays under the target: the coefficient rises by delta each step and applies from the 2nd
    {"entropy_target": 10.0},
    # over the target: it falls to the minimum and never applies
    {"entropy_target": 0.0, "entropy_coef_min": 0.002},
    {"entropy_target": 10.0, "top_entropy_quantile": 0.5, "loss_type": "dapo"},
])
def test_adaptive_entropy_equals_trl(tmp_path, extra):
    extra = {"loss_type": "grpo", **extra}
    args = config(tmp_path, max_steps=3, gradient_accumulation_steps=2, use_adaptive_entropy=True,
                  entropy_coef=0.01, entropy_coef_delta=0.02, **extra)
    tr = CheckingAdaptive(model=tiny_model(tmp_path / "model"), reward_funcs=reward_a, args=args,
                          train_dataset=dataset(), processing_class=tokenizer())
    tr.checks, tr.states = [], []
    tr.train()
    assert len(tr.checks) == 6
    assert_same_losses(tr.checks)
    for (c1, e1, w1), (c2, e2, w2) in tr.states:
        assert c1 == pytest.approx(c2, abs=1e-12) and e1 == pytest.approx(e2, rel=1e-6)
        assert (w1 is None) == (w2 is None) and (w1 is None or torch.allclose(w1, w2, rtol=1e-6))
    coefs = [c for (c, _, _), _ in tr.states[1::2]]  # after each optimizer step
    if extra["entropy_target"] > 1.0:
        assert coefs == pytest.approx([0.03, 0.05, 0.07])
    else:
        assert coefs == pytest.approx([0.002] * 3)


def test_moe_router_aux_loss_equals_trl(tmp_path):
    """A tiny Qwen2-MoE: TRL adds router_aux_loss_coef * the routers' load-balancing loss; so does rlpt's trainer."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM
    torch.manual_seed(0)
    cfg = Qwen2MoeConfig(vocab_size=len(VOCAB), hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                         shared_expert_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=1,
                         router_aux_loss_coef=0.5)
    path = tmp_path / "moe"
    Qwen2MoeForCausalLM(cfg).save_pretrained(path)
    tokenizer().save_pretrained(path)
    args = config(tmp_path, loss_type="bnpo", max_steps=1, gradient_accumulation_steps=2)
    tr = Checking(model=str(path), reward_funcs=reward_a, args=args, train_dataset=dataset(),
                  processing_class=tokenizer())
    assert tr.aux_loss_enabled
    tr.checks = []
    tr.train()
    assert len(tr.checks) == 2
    assert_same_losses(tr.checks)
    assert any(h.get("aux_loss", 0.0) > 0.0 for h in tr.state.log_history)


# --- RLOOTrainer ------------------------------------------------------------------------------------

class CheckingRLOO(rlpt.trl.RLOOTrainer):
    """At every step: rlpt's RLOO loss and gradients next to TRL's own on the same inputs, and
    TRL's metrics next to rlpt's."""

    checks = None

    def _compute_loss(self, model, inputs):
        from trl import RLOOTrainer as TRLRLOOTrainer
        params = [p for p in model.parameters() if p.requires_grad]
        ours = super()._compute_loss(model, inputs)
        assert self.rlpt_loss_used == "rlpt"
        mode = "train" if self.model.training else "eval"
        logged = {k: v[-1] for k, v in self._metrics[mode].items() if v}
        theirs = TRLRLOOTrainer._compute_loss(self, model, inputs)
        for k, v in logged.items():
            assert self._metrics[mode][k][-1] == pytest.approx(v, rel=1e-5, abs=1e-7), k
        g1 = torch.autograd.grad(ours, params, retain_graph=True)
        g2 = torch.autograd.grad(theirs, params, retain_graph=True)
        self.checks.append((ours.detach(), theirs.detach(), g1, g2))
        self.rows += inputs["completion_mask"].size(0)
        self.empty_rows += int((inputs["completion_mask"].sum(1) == 0).sum())
        self.clipped += sum(self._metrics[mode]["clip_ratio/region_mean"][-1:])
        return ours


@pytest.mark.parametrize("extra", [
    {},
    {"epsilon_high": 0.28, "gradient_accumulation_steps": 2},
    # the second and third steps reuse the batch: ratios away from 1, clipped at a small epsilon
    {"num_iterations": 3, "epsilon": 0.002, "learning_rate": 3e-2},
    {"steps_per_generation": 2, "gradient_accumulation_steps": 1, "epsilon": 0.002, "learning_rate": 3e-2},
    # truncated completions lose their mask: rows with no token, whose TRL loss is -A
    {"mask_truncated_completions": True, "max_completion_length": 3, "beta": 0.05},
])
def test_rloo_steps_equal_trl(tmp_path, extra):
    from trl import RLOOConfig
    base = dict(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[], per_device_train_batch_size=8,
                num_generations=4, max_completion_length=8, logging_steps=1, save_strategy="no", seed=0,
                learning_rate=3e-3, disable_tqdm=True, max_steps=3)
    base.update(extra)
    tr = CheckingRLOO(model=tiny_model(tmp_path / "model"), reward_funcs=reward_a, args=RLOOConfig(**base),
                      train_dataset=dataset(), processing_class=tokenizer())
    tr.checks, tr.rows, tr.empty_rows, tr.clipped = [], 0, 0, 0.0
    tr.train()
    assert len(tr.checks) == 3 * base.get("gradient_accumulation_steps", 1)
    assert_same_losses(tr.checks)
    if extra.get("epsilon") == 0.002:
        assert tr.clipped > 0  # the clip binds at some step
    if extra.get("mask_truncated_completions"):
        assert 0 < tr.empty_rows < tr.rows


def test_rloo_twenty_steps_raise_the_reward(tmp_path):
    from trl import RLOOConfig
    args = RLOOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[], per_device_train_batch_size=16,
                      num_generations=8, max_completion_length=8, logging_steps=1, save_strategy="no", seed=0,
                      learning_rate=2e-2, disable_tqdm=True, max_steps=20, temperature=1.0)
    tr = rlpt.trl.RLOOTrainer(model=tiny_model(tmp_path / "model", 1), reward_funcs=reward_a, args=args,
                              train_dataset=dataset(320), processing_class=tokenizer())
    tr.train()
    assert tr.rlpt_loss_used == "rlpt"
    rewards = [h["reward"] for h in tr.state.log_history if "reward" in h]
    assert len(rewards) == 20
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.1, rewards
