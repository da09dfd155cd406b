// SPDX-License-Identifier: Apache-2.0
// Device advantage estimators against the host implementations: GRPO / RLOO bit for bit (the
// canonical reduction order is shared), GAE / returns / whitening to fp32 rounding, GAE rows
// bit-identical whatever the batch around them.
#include <rlpt/advantage.hpp>
#include <rlpt/cuda/advantage/advantage.cuh>

#include "common.hpp"
#include "support/errors.hpp"
#include "support/random.hpp"
#include "support/reference.hpp"

#include <doctest/doctest.h>

#include "support/device_buffer.cuh"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

template <class T> using dev_buffer = rlpt::test::device_buffer<T>;

//! Runs a device entry point twice: size query, then with a freshly allocated workspace.
template <class F> void with_workspace(F&& call) {
  rlpt::workspace ws;
  call(ws);
  dev_buffer<char> buf(ws.bytes);
  ws.data = buf.view().data();
  call(ws);
  RLPT_CUDA_CHECK(cudaDeviceSynchronize());
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct group_batch {
  std::vector<std::int64_t> ids;
  std::vector<float> rewards;
};

group_batch random_groups(std::uint64_t stream, int groups, int max_size, bool with_nan) {
  rlpt::test::rng r(stream);
  group_batch b;
  for (int g = 0; g < groups; ++g) {
    const auto n = r.integer(1, max_size);
    for (std::int64_t i = 0; i < n; ++i) {
      b.ids.push_back(g * 13 % 997);
      const int kind = g % 4;
      b.rewards.push_back(kind == 0   ? static_cast<float>(r.integer(0, 1))
                          : kind == 1 ? 0.35f
                                      : static_cast<float>(r.normal(1.0, 2.0)));
    }
  }
  // shuffle ids so groups are not contiguous
  for (std::size_t i = b.ids.size(); i > 1; --i) {
    const auto j = static_cast<std::size_t>(r.integer(0, static_cast<std::int64_t>(i - 1)));
    std::swap(b.ids[i - 1], b.ids[j]);
    std::swap(b.rewards[i - 1], b.rewards[j]);
  }
  if (with_nan)
    for (std::size_t i = 3; i < b.rewards.size(); i += 97) b.rewards[i] = std::numeric_limits<float>::quiet_NaN();
  return b;
}

} // namespace

TEST_CASE("gpu grpo / rloo: bit-identical to the host, statistics and counters included") {
  for (const int max_size : {1, 5, 16, 64, 200}) {
    for (const bool with_nan : {false, true}) {
      CAPTURE(max_size);
      CAPTURE(with_nan);
      const group_batch b = random_groups(static_cast<std::uint64_t>(max_size), 700, max_size, with_nan);
      const auto g = rlpt::groups::from_ids(b.ids);
      const dev_buffer<float> rewards(b.rewards);
      const dev_buffer<rlpt::index_t> offsets(std::vector<rlpt::index_t>(g.offsets().begin(), g.offsets().end()));
      const dev_buffer<rlpt::index_t> members(std::vector<rlpt::index_t>(g.members().begin(), g.members().end()));
      const rlpt::device_groups dg{offsets.cview(), members.cview(), rlpt::max_group_size(g)};
      const auto G = static_cast<std::size_t>(g.num_groups());
      dev_buffer<float> out(b.rewards.size()), mean(G), stdv(G);
      dev_buffer<rlpt::index_t> size(G), counters(3);
      dev_buffer<rlpt::mask_t> degenerate(G);
      const rlpt::device_group_stats ds{mean.view(), stdv.view(), size.view(), degenerate.view(), counters.view()};
      std::vector<float> host(b.rewards.size());
      for (const auto& preset :
           {rlpt::compat::verl::grpo(), rlpt::compat::trl::grpo("batch"), rlpt::compat::verl::dr_grpo(),
            rlpt::compat::areal::reward_norm(), rlpt::grpo_options{.unbiased = false, .std_floor = 0.01}}) {
        const auto o = rlpt::device_policies(preset);
        const rlpt::group_stats hs = rlpt::grpo_advantages(b.rewards, g, host, o);
        with_workspace(
            [&](rlpt::workspace& ws) { rlpt::grpo_advantages(rewards.cview(), dg, out.view(), o, ds, ws, nullptr); });
        CHECK(same_bits(out.get(), host));
        CHECK(same_bits(mean.get(), hs.mean));
        CHECK(same_bits(stdv.get(), hs.std));
        CHECK(size.get() == hs.size);
        CHECK(degenerate.get() == hs.degenerate);
        const auto c = counters.get();
        CHECK(c[0] == hs.num_nonfinite);
        CHECK(c[1] == hs.num_degenerate);
      }
      for (const auto& preset :
           {rlpt::compat::verl::rloo(), rlpt::compat::verl::rloo_vectorized(), rlpt::rloo_options{}}) {
        const auto o = rlpt::device_policies(preset);
        (void)rlpt::rloo_advantages(b.rewards, g, host, o);
        with_workspace(
            [&](rlpt::workspace& ws) { rlpt::rloo_advantages(rewards.cview(), dg, out.view(), o, ds, ws, nullptr); });
        CHECK(same_bits(out.get(), host));
      }
    }
  }
}

TEST_CASE("gpu grpo: raising policies are refused with a pointer to device_policies") {
  const std::vector<float> r = {1, 0};
  const dev_buffer<float> rewards(r);
  const dev_buffer<rlpt::index_t> offsets(std::vector<rlpt::index_t>{0, 2}), members(std::vector<rlpt::index_t>{0, 1});
  dev_buffer<float> out(2);
  rlpt::workspace ws;
  RLPT_CHECK_ERROR(rlpt::grpo_advantages(rewards.cview(), {offsets.cview(), members.cview(), 2}, out.view(),
                                         rlpt::compat::verl::grpo(), {}, ws, nullptr),
                   "rlpt.advantage.device_policy", "rlpt::device_policies");
}

namespace {

struct token_batch {
  rlpt::index_t B, T;
  std::vector<float> rewards, values;
  std::vector<std::uint8_t> mask;
};

token_batch random_tokens(std::uint64_t stream, rlpt::index_t B, rlpt::index_t T) {
  rlpt::test::rng r(stream);
  token_batch b{B, T, r.normals(static_cast<std::size_t>(B * T), 0.0, 0.2), r.normals(static_cast<std::size_t>(B * T)),
                std::vector<std::uint8_t>(static_cast<std::size_t>(B * T), 0)};
  for (rlpt::index_t i = 0; i < B; ++i) {
    const rlpt::index_t n = i == 0 ? T : i == 1 ? 0 : r.integer(1, T);
    for (rlpt::index_t t = 0; t < n; ++t) b.mask[static_cast<std::size_t>(i * T + t)] = 1;
    for (int h = 0; h < 3 && n > 40; ++h)
      for (rlpt::index_t t = r.integer(1, n - 20), e = t + r.integer(1, 15); t < e; ++t)
        b.mask[static_cast<std::size_t>(i * T + t)] = 0;
  }
  return b;
}

constexpr rlpt::test::tolerance scan_vs_loop{2e-6, 2e-7};

} // namespace

TEST_CASE("gpu gae: matches the host for every mask mode, long rows, packed rows and bootstrap") {
  const token_batch b = random_tokens(31, 24, 5000); // rows span 3 tiles of 2048 tokens
  const auto host_layout = rlpt::token_layout::padded(b.B, b.T);
  const auto dev_layout = rlpt::device_token_layout::padded(b.B, b.T);
  const dev_buffer<float> rewards(b.rewards), values(b.values);
  const dev_buffer<rlpt::mask_t> mask(b.mask);
  std::vector<float> boot(static_cast<std::size_t>(b.B));
  for (std::size_t i = 0; i < boot.size(); ++i) boot[i] = 0.1f * static_cast<float>(i % 5);
  const dev_buffer<float> bootstrap(boot);
  dev_buffer<float> adv(b.rewards.size()), ret(b.rewards.size());
  dev_buffer<rlpt::device_token_report> report(1);
  std::vector<float> hadv(b.rewards.size()), hret(hadv.size());
  for (const auto mode : {rlpt::mask_mode::skip, rlpt::mask_mode::zero, rlpt::mask_mode::reset})
    for (const auto& [gamma, lambda] : {std::pair{1.0, 1.0}, std::pair{0.99, 0.95}}) {
      CAPTURE(static_cast<int>(mode));
      CAPTURE(gamma);
      const rlpt::gae_options o{
          .gamma = gamma, .lambda = lambda, .masked = mode, .on_nonfinite = rlpt::nonfinite::mask};
      (void)rlpt::gae(
          {.layout = host_layout, .rewards = b.rewards, .values = b.values, .mask = b.mask, .bootstrap = boot}, hadv,
          hret, o);
      with_workspace([&](rlpt::workspace& ws) {
        rlpt::gae({.layout = dev_layout,
                   .rewards = rewards.cview(),
                   .values = values.cview(),
                   .mask = mask.cview(),
                   .bootstrap = bootstrap.cview()},
                  adv.view(), ret.view(), o, report.view(), ws, nullptr);
      });
      ADV_CHECK_CLOSE(adv.get(), hadv, scan_vs_loop);
      ADV_CHECK_CLOSE(ret.get(), hret, scan_vs_loop);
      CHECK(report.get()[0].num_nonfinite_seqs == 0);
    }
}

TEST_CASE("gpu gae: a row's bits do not depend on the batch around it, nor on the run") {
  const token_batch b = random_tokens(32, 40, 3000);
  const dev_buffer<float> rewards(b.rewards), values(b.values);
  const dev_buffer<rlpt::mask_t> mask(b.mask);
  dev_buffer<float> adv(b.rewards.size()), adv2(b.rewards.size());
  const auto o = rlpt::gae_options{.gamma = 0.99, .lambda = 0.95, .on_nonfinite = rlpt::nonfinite::mask};
  const auto layout = rlpt::device_token_layout::padded(b.B, b.T);
  auto run = [&](const rlpt::device_token_layout& l, rlpt::index_t first, dev_buffer<float>& out) {
    const auto off = first * b.T;
    const auto n = l.storage_size();
    with_workspace([&](rlpt::workspace& ws) {
      rlpt::gae({.layout = l,
                 .rewards = {rewards.cview().data() + off, n},
                 .values = {values.cview().data() + off, n},
                 .mask = {mask.cview().data() + off, n}},
                {out.view().data() + off, n}, {}, o, {}, ws, nullptr);
    });
  };
  run(layout, 0, adv);
  const auto full = adv.get();
  run(layout, 0, adv2);
  CHECK(same_bits(adv2.get(), full));
  // rows 7..9 alone
  dev_buffer<float> part(b.rewards.size());
  run(rlpt::device_token_layout::padded(3, b.T), 7, part);
  const auto p = part.get();
  CHECK(std::memcmp(p.data() + 7 * b.T, full.data() + 7 * b.T, static_cast<std::size_t>(3 * b.T) * sizeof(float)) == 0);
}

TEST_CASE("gpu gae + whitening (verl preset via device_policies), packed layout, REINFORCE++, NaN rows") {
  token_batch b = random_tokens(33, 30, 700);
  b.values[static_cast<std::size_t>(5 * b.T + 3)] = std::numeric_limits<float>::quiet_NaN();
  b.mask[static_cast<std::size_t>(5 * b.T + 3)] = 1;
  // packed copy of the padded batch (every slot, so indices agree)
  std::vector<rlpt::index_t> offsets;
  for (rlpt::index_t i = 0; i <= b.B; ++i) offsets.push_back(i * b.T);
  const dev_buffer<rlpt::index_t> d_offsets(offsets);
  const auto host_layout = rlpt::token_layout::packed(offsets);
  const auto dev_layout = rlpt::device_token_layout::packed(d_offsets.cview(), b.B * b.T, b.T);
  const dev_buffer<float> rewards(b.rewards), values(b.values);
  const dev_buffer<rlpt::mask_t> mask(b.mask);
  dev_buffer<float> adv(b.rewards.size()), ret(b.rewards.size());
  dev_buffer<rlpt::device_token_report> report(1);
  std::vector<float> hadv(b.rewards.size()), hret(hadv.size());

  const auto o = rlpt::device_policies(rlpt::compat::verl::gae(0.99, 0.95));
  const auto hr =
      rlpt::gae({.layout = host_layout, .rewards = b.rewards, .values = b.values, .mask = b.mask}, hadv, hret, o);
  with_workspace([&](rlpt::workspace& ws) {
    rlpt::gae({.layout = dev_layout, .rewards = rewards.cview(), .values = values.cview(), .mask = mask.cview()},
              adv.view(), ret.view(), o, report.view(), ws, nullptr);
  });
  const auto rep = report.get()[0];
  CHECK(rep.num_nonfinite_seqs == 1);
  CHECK(hr.num_nonfinite_seqs == 1);
  CHECK(rep.whitening.count == hr.whitening->stats.count);
  CHECK(rep.whitening.mean == doctest::Approx(hr.whitening->stats.mean).epsilon(1e-12));
  CHECK(rep.whitening.m2 == doctest::Approx(hr.whitening->stats.m2).epsilon(1e-11));
  ADV_CHECK_CLOSE(adv.get(), hadv, scan_vs_loop);
  ADV_CHECK_CLOSE(ret.get(), hret, scan_vs_loop);

  const auto ro = rlpt::device_policies(rlpt::compat::openrlhf::reinforce(0.97));
  (void)rlpt::reinforce_pp_advantages(host_layout, b.rewards, b.mask, hadv, hret, ro);
  with_workspace([&](rlpt::workspace& ws) {
    rlpt::reinforce_pp_advantages(dev_layout, rewards.cview(), mask.cview(), adv.view(), ret.view(), ro, report.view(),
                                  ws, nullptr);
  });
  ADV_CHECK_CLOSE(adv.get(), hadv, scan_vs_loop);
  ADV_CHECK_CLOSE(ret.get(), hret, scan_vs_loop);
}

TEST_CASE("gpu whitening: moments, merge of per-shard moments, apply") {
  const token_batch b = random_tokens(34, 64, 300);
  const auto layout = rlpt::device_token_layout::padded(b.B, b.T);
  const dev_buffer<float> x(b.rewards);
  const dev_buffer<rlpt::mask_t> mask(b.mask);
  dev_buffer<float> out(b.rewards.size());
  dev_buffer<rlpt::moments> stats(1), shards(2), merged(1);
  const auto o = rlpt::device_policies(rlpt::compat::openrlhf::whiten());
  std::vector<float> host(b.rewards.size());
  const auto hr = rlpt::whiten(rlpt::token_layout::padded(b.B, b.T), b.rewards, b.mask, host, o);
  with_workspace([&](rlpt::workspace& ws) {
    rlpt::whiten(layout, x.cview(), mask.cview(), out.view(), o, stats.view(), ws, nullptr);
  });
  ADV_CHECK_CLOSE(out.get(), host, (rlpt::test::tolerance{1e-6, 1e-7}));
  const auto st = stats.get()[0];
  CHECK(st.count == hr.stats.count);
  CHECK(st.m2 == doctest::Approx(hr.stats.m2).epsilon(1e-12));
  // two shards of 32 rows, merged on the device
  const auto half = rlpt::device_token_layout::padded(32, b.T);
  const auto n = 32 * b.T;
  for (int s = 0; s < 2; ++s)
    with_workspace([&](rlpt::workspace& ws) {
      rlpt::whiten_moments(half, {x.cview().data() + s * n, n}, {mask.cview().data() + s * n, n},
                           {shards.view().data() + s, 1}, ws, nullptr);
    });
  rlpt::merge_moments(shards.cview(), merged.view(), nullptr);
  RLPT_CUDA_CHECK(cudaDeviceSynchronize());
  const auto m = merged.get()[0];
  CHECK(m.count == hr.stats.count);
  CHECK(m.mean == doctest::Approx(hr.stats.mean).epsilon(1e-13));
  CHECK(m.m2 == doctest::Approx(hr.stats.m2).epsilon(1e-12));
}

TEST_CASE(
    "gpu gae: packed rows of mixed lengths (1024- and 2048-token tiles) match the host, each row's bits its own") {
  // rows up to 1024 tokens run with 4 tokens per thread (one full tile), longer ones with 8; the
  // choice is per row, so a row gives the same bits alone as in any batch
  const std::vector<rlpt::index_t> lengths = {1024, 1025, 300, 5000, 1, 2048, 700, 4096, 1023};
  std::vector<rlpt::index_t> offsets = {0};
  for (const auto n : lengths) offsets.push_back(offsets.back() + n);
  const rlpt::index_t total = offsets.back();
  const token_batch b = random_tokens(35, 1, total); // one long masked row, cut into sequences
  const dev_buffer<rlpt::index_t> d_offsets(offsets);
  const auto host_layout = rlpt::token_layout::packed(offsets);
  const auto dev_layout = rlpt::device_token_layout::packed(d_offsets.cview(), total, 5000);
  const dev_buffer<float> rewards(b.rewards), values(b.values);
  const dev_buffer<rlpt::mask_t> mask(b.mask);
  dev_buffer<float> adv(b.rewards.size()), ret(b.rewards.size());
  std::vector<float> hadv(b.rewards.size()), hret(hadv.size());
  const rlpt::gae_options o{
      .gamma = 0.99, .lambda = 0.95, .masked = rlpt::mask_mode::zero, .on_nonfinite = rlpt::nonfinite::mask};
  (void)rlpt::gae({.layout = host_layout, .rewards = b.rewards, .values = b.values, .mask = b.mask}, hadv, hret, o);
  with_workspace([&](rlpt::workspace& ws) {
    rlpt::gae({.layout = dev_layout, .rewards = rewards.cview(), .values = values.cview(), .mask = mask.cview()},
              adv.view(), ret.view(), o, {}, ws, nullptr);
  });
  const auto full = adv.get();
  ADV_CHECK_CLOSE(full, hadv, scan_vs_loop);
  ADV_CHECK_CLOSE(ret.get(), hret, scan_vs_loop);
  for (std::size_t k = 0; k < lengths.size(); ++k) { // each sequence alone
    const std::vector<rlpt::index_t> one = {0, lengths[k]};
    const dev_buffer<rlpt::index_t> d_one(one);
    const auto off = offsets[k], n = lengths[k];
    dev_buffer<float> alone(static_cast<std::size_t>(n));
    with_workspace([&](rlpt::workspace& ws) {
      rlpt::gae({.layout = rlpt::device_token_layout::packed(d_one.cview(), n, n),
                 .rewards = {rewards.cview().data() + off, n},
                 .values = {values.cview().data() + off, n},
                 .mask = {mask.cview().data() + off, n}},
                alone.view(), {}, o, {}, ws, nullptr);
    });
    const auto a = alone.get();
    CAPTURE(n);
    CHECK(std::memcmp(a.data(), full.data() + off, static_cast<std::size_t>(n) * sizeof(float)) == 0);
  }
}

TEST_CASE("gpu whitening: token chunks across rows, a row stride wider than the rows, packed layouts") {
  // the moments kernel walks tokens in fixed chunks of 8192 whatever the rows; slots between a
  // padded row's end and its stride are neither read nor written
  const rlpt::index_t B = 50, T = 1000, stride = 1003;
  const token_batch b = random_tokens(36, B, stride);
  std::vector<float> x = b.rewards;
  std::vector<rlpt::mask_t> m = b.mask;
  for (rlpt::index_t r = 0; r < B; ++r)
    for (rlpt::index_t t = T; t < stride; ++t) {
      x[static_cast<std::size_t>(r * stride + t)] = 1.0e6f; // valid and finite: reading it would move the moments
      m[static_cast<std::size_t>(r * stride + t)] = 1;
    }
  const auto o = rlpt::device_policies(rlpt::compat::openrlhf::whiten());
  std::vector<float> host(x.size(), 7.0f);
  const auto hr = rlpt::whiten(rlpt::token_layout::padded(B, T, stride), x, m, host, o);
  const dev_buffer<float> dx(x);
  const dev_buffer<rlpt::mask_t> dm(m);
  dev_buffer<float> out(std::vector<float>(x.size(), 7.0f));
  dev_buffer<rlpt::moments> stats(1);
  with_workspace([&](rlpt::workspace& ws) {
    rlpt::whiten(rlpt::device_token_layout::padded(B, T, stride), dx.cview(), dm.cview(), out.view(), o, stats.view(),
                 ws, nullptr);
  });
  const auto st = stats.get()[0];
  CHECK(st.count == hr.stats.count);
  CHECK(st.mean == doctest::Approx(hr.stats.mean).epsilon(1e-12));
  CHECK(st.m2 == doctest::Approx(hr.stats.m2).epsilon(1e-11));
  const auto got = out.get();
  ADV_CHECK_CLOSE(got, host, (rlpt::test::tolerance{1e-6, 1e-7})); // gap slots: 7 on both sides
  // packed: sequences of uneven lengths crossing the chunk boundaries
  std::vector<rlpt::index_t> offsets = {0};
  rlpt::test::rng r(37);
  while (offsets.back() < 30000) offsets.push_back(offsets.back() + r.integer(1, 3000));
  const rlpt::index_t total = offsets.back();
  const token_batch p = random_tokens(38, 1, total);
  const dev_buffer<rlpt::index_t> d_offsets(offsets);
  const dev_buffer<float> px(p.rewards);
  const dev_buffer<rlpt::mask_t> pm(p.mask);
  dev_buffer<float> pout(p.rewards.size());
  std::vector<float> phost(p.rewards.size());
  const auto pr = rlpt::whiten(rlpt::token_layout::packed(offsets), p.rewards, p.mask, phost, o);
  with_workspace([&](rlpt::workspace& ws) {
    rlpt::whiten(rlpt::device_token_layout::packed(d_offsets.cview(), total, 3000), px.cview(), pm.cview(), pout.view(),
                 o, stats.view(), ws, nullptr);
  });
  const auto ps = stats.get()[0];
  CHECK(ps.count == pr.stats.count);
  CHECK(ps.m2 == doctest::Approx(pr.stats.m2).epsilon(1e-11));
  ADV_CHECK_CLOSE(pout.get(), phost, (rlpt::test::tolerance{1e-6, 1e-7}));
}

#if RLPT_HAS_NCCL()
TEST_CASE("gpu whitening over NCCL: a single-rank all-gather merges to the local moments") {
  const token_batch b = random_tokens(35, 16, 200);
  const auto layout = rlpt::device_token_layout::padded(b.B, b.T);
  const dev_buffer<float> x(b.rewards);
  const dev_buffer<rlpt::mask_t> mask(b.mask);
  dev_buffer<rlpt::moments> local(1), gathered(1), merged(1);
  with_workspace(
      [&](rlpt::workspace& ws) { rlpt::whiten_moments(layout, x.cview(), mask.cview(), local.view(), ws, nullptr); });
  ncclComm_t comm;
  int dev = 0;
  RLPT_NCCL_CHECK(ncclCommInitAll(&comm, 1, &dev));
  rlpt::allgather_moments(local.cview(), gathered.view(), merged.view(), comm, nullptr);
  RLPT_CUDA_CHECK(cudaDeviceSynchronize());
  RLPT_NCCL_CHECK(ncclCommDestroy(comm));
  const auto l = local.get()[0], m = merged.get()[0];
  CHECK(m.count == l.count);
  CHECK(m.mean == l.mean);
  CHECK(m.m2 == l.m2);
  dev_buffer<rlpt::moments> wrong(2);
  ncclComm_t c2;
  RLPT_NCCL_CHECK(ncclCommInitAll(&c2, 1, &dev));
  RLPT_CHECK_ERROR(rlpt::allgather_moments(local.cview(), wrong.view(), merged.view(), c2, nullptr),
                   "rlpt.view.size_mismatch", "gathered has 2 elements, expected 1");
  RLPT_NCCL_CHECK(ncclCommDestroy(c2));
}
#endif
