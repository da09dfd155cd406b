// SPDX-License-Identifier: Apache-2.0
// Packed / right-padded / left-padded sequences give the same numbers for the same tokens,
// nothing leaks across a packed boundary, and vocab-parallel shards reproduce the unsharded
// result (simulated ranks on threads with a barrier-based all-reduce hook).
#include <rlpt/logprob.hpp>

#include "fake_group.hpp"
#include "reference.hpp"
#include "support/errors.hpp"
#include "support/random.hpp"
#include "support/reference.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <thread>
#include <vector>

using rlpt::index_t;
namespace lt = rlpt::test;

namespace {

struct sequences {
  index_t vocab;
  std::vector<std::vector<index_t>> tokens; // per sequence
  std::vector<std::vector<float>> logits;   // per sequence: len × vocab (row t = output at token t)
};

sequences make_sequences(lt::rng& g, index_t vocab, const std::vector<index_t>& lengths) {
  sequences s{vocab, {}, {}};
  for (const index_t len : lengths) {
    std::vector<index_t> t(static_cast<std::size_t>(len));
    for (auto& x : t) x = g.integer(0, vocab - 1);
    s.tokens.push_back(t);
    s.logits.push_back(lt::random_logits<float>(g, static_cast<std::size_t>(len * vocab)));
  }
  return s;
}

struct per_token {
  std::vector<float> logp, ent;
  std::vector<rlpt::mask_t> scored;
};

// Packed: sequences back to back.
per_token run_packed(const sequences& s, std::vector<float>* grad_out = nullptr, float temp = 1.0f) {
  std::vector<index_t> off = {0};
  std::vector<index_t> tok;
  std::vector<float> x;
  for (std::size_t b = 0; b < s.tokens.size(); ++b) {
    tok.insert(tok.end(), s.tokens[b].begin(), s.tokens[b].end());
    x.insert(x.end(), s.logits[b].begin(), s.logits[b].end());
    off.push_back(off.back() + static_cast<index_t>(s.tokens[b].size()));
  }
  const index_t n = off.back();
  const auto layout = rlpt::token_layout::packed(off);
  per_token r{std::vector<float>(n, 7.0f), std::vector<float>(n, 7.0f), std::vector<rlpt::mask_t>(n, 7)};
  std::vector<float> lse(n);
  const rlpt::view2d<const float> xv(x.data(), n, s.vocab);
  rlpt::sequence_logprob_entropy(xv, tok, layout, {},
                                 {.logp = r.logp, .entropy = r.ent, .saved = {.lse = lse}, .scored = r.scored},
                                 {.temperature = temp});
  if (grad_out != nullptr) {
    std::vector<float> dl(n), dh(n);
    for (index_t i = 0; i < n; ++i) {
      dl[i] = 0.5f + 0.01f * static_cast<float>(i % 7);
      dh[i] = -0.25f;
    }
    grad_out->assign(x.size(), 9.0f);
    rlpt::sequence_logprob_entropy_backward(xv, tok, layout, {},
                                            {.dlogp = dl, .dentropy = dh, .entropy = r.ent, .saved = {.lse = lse}},
                                            rlpt::view2d<float>(grad_out->data(), n, s.vocab), {.temperature = temp});
  }
  return r;
}

// Padded [B, T] (row stride T + 2), right or left aligned, garbage in the padding.
per_token run_padded(const sequences& s, bool left, lt::rng& g, std::vector<std::vector<float>>* grads = nullptr,
                     float temp = 1.0f) {
  index_t tmax = 0;
  for (const auto& t : s.tokens) tmax = std::max<index_t>(tmax, static_cast<index_t>(t.size()));
  const index_t stride = tmax + 2, bsz = static_cast<index_t>(s.tokens.size()), slots = bsz * stride;
  std::vector<index_t> tok(static_cast<std::size_t>(slots));
  std::vector<rlpt::mask_t> valid(static_cast<std::size_t>(slots), 0);
  auto x = lt::random_logits<float>(g, static_cast<std::size_t>(slots * s.vocab), 50.0); // garbage
  for (auto& t : tok) t = g.integer(-1000, 1000);                                        // garbage ids
  for (index_t b = 0; b < bsz; ++b) {
    const auto len = static_cast<index_t>(s.tokens[b].size());
    const index_t start = b * stride + (left ? tmax - len : 0);
    for (index_t t = 0; t < len; ++t) {
      tok[start + t] = s.tokens[b][t];
      valid[start + t] = 1;
      std::memcpy(x.data() + (start + t) * s.vocab, s.logits[b].data() + t * s.vocab, sizeof(float) * s.vocab);
    }
  }
  const auto layout = rlpt::token_layout::padded(bsz, tmax, stride);
  per_token full{std::vector<float>(slots, 7.0f), std::vector<float>(slots, 7.0f), std::vector<rlpt::mask_t>(slots, 7)};
  std::vector<float> lse(slots);
  const rlpt::view2d<const float> xv(x.data(), slots, s.vocab);
  rlpt::sequence_logprob_entropy(xv, tok, layout, valid,
                                 {.logp = full.logp, .entropy = full.ent, .saved = {.lse = lse}, .scored = full.scored},
                                 {.temperature = temp});
  std::vector<float> grad;
  if (grads != nullptr) {
    std::vector<float> dl(slots, 0.0f), dh(slots, 0.0f);
    index_t packed_i = 0;
    for (index_t b = 0; b < bsz; ++b) {
      const auto len = static_cast<index_t>(s.tokens[b].size());
      const index_t start = b * stride + (left ? tmax - len : 0);
      for (index_t t = 0; t < len; ++t, ++packed_i) {
        dl[start + t] = 0.5f + 0.01f * static_cast<float>(packed_i % 7);
        dh[start + t] = -0.25f;
      }
    }
    grad.assign(x.size(), 9.0f);
    rlpt::sequence_logprob_entropy_backward(xv, tok, layout, valid,
                                            {.dlogp = dl, .dentropy = dh, .entropy = full.ent, .saved = {.lse = lse}},
                                            rlpt::view2d<float>(grad.data(), slots, s.vocab), {.temperature = temp});
  }
  // back to packed order; every padding slot must be 0 / unscored
  per_token r;
  for (index_t b = 0; b < bsz; ++b) {
    const auto len = static_cast<index_t>(s.tokens[b].size());
    const index_t start = b * stride + (left ? tmax - len : 0);
    for (index_t i = b * stride; i < (b + 1) * stride; ++i) {
      if (i >= start && i < start + len) {
        r.logp.push_back(full.logp[i]);
        r.ent.push_back(full.ent[i]);
        r.scored.push_back(full.scored[i]);
        if (grads != nullptr) grads->emplace_back(grad.begin() + i * s.vocab, grad.begin() + (i + 1) * s.vocab);
      } else {
        CHECK(full.logp[i] == 0.0f);
        CHECK(full.ent[i] == 0.0f);
        CHECK(full.scored[i] == 0);
        if (grads != nullptr)
          for (index_t j = 0; j < s.vocab; ++j) CHECK(grad[i * s.vocab + j] == 0.0f);
      }
    }
  }
  return r;
}

} // namespace

TEST_CASE("packed, right-padded and left-padded sequences agree bit for bit, against the fp64 reference") {
  lt::rng g(40);
  const auto s = make_sequences(g, 333, {5, 1, 9, 2, 17});
  std::vector<float> gp;
  const auto packed = run_packed(s, &gp, 0.8f);
  std::vector<std::vector<float>> gr, gl;
  const auto right = run_padded(s, false, g, &gr, 0.8f);
  const auto left = run_padded(s, true, g, &gl, 0.8f);
  CHECK(packed.logp == right.logp);
  CHECK(packed.logp == left.logp);
  CHECK(packed.ent == right.ent);
  CHECK(packed.ent == left.ent);
  CHECK(packed.scored == right.scored);
  CHECK(packed.scored == left.scored);
  index_t i = 0;
  for (std::size_t b = 0; b < s.tokens.size(); ++b)
    for (std::size_t t = 0; t < s.tokens[b].size(); ++t, ++i) {
      const std::vector<float> row(gp.begin() + i * s.vocab, gp.begin() + (i + 1) * s.vocab);
      CHECK(row == gr[static_cast<std::size_t>(i)]);
      CHECK(row == gl[static_cast<std::size_t>(i)]);
      if (t == 0) {
        // first token: no logprob
        CHECK(packed.scored[i] == 0);
        CHECK(packed.logp[i] == 0.0f);
      } else {
        const auto ref =
            lt::reference_row(std::vector<double>(s.logits[b].begin() + static_cast<index_t>(t - 1) * s.vocab,
                                                  s.logits[b].begin() + static_cast<index_t>(t) * s.vocab),
                              0.8, s.tokens[b][t]);
        CHECK(packed.scored[i] == 1);
        CHECK(packed.logp[i] == doctest::Approx(ref.logp).epsilon(2e-5));
        CHECK(packed.ent[i] == doctest::Approx(ref.entropy).epsilon(2e-5));
      }
      if (t + 1 == s.tokens[b].size()) // the last row predicts nothing: zero gradient
        for (float v : row) CHECK(v == 0.0f);
    }
}

TEST_CASE("nothing leaks across a packed boundary") {
  lt::rng g(41);
  auto s = make_sequences(g, 100, {6, 6, 6});
  std::vector<float> g0;
  const auto base = run_packed(s, &g0);
  // change what a leaking implementation would read: the last logits row of sequence 0 and the
  // first token of sequence 1
  for (auto& v : std::span(s.logits[0]).subspan(5 * 100, 100)) v = v * 3.0f + 1.0f;
  s.tokens[1][0] = (s.tokens[1][0] + 17) % 100;
  std::vector<float> g1;
  const auto moved = run_packed(s, &g1);
  CHECK(base.logp == moved.logp);
  CHECK(base.ent == moved.ent);
  CHECK(g0 == g1);
}

TEST_CASE("empty sequences, single-token sequences and ignore_index tokens are not scored") {
  lt::rng g(42);
  const index_t vocab = 50;
  const std::vector<index_t> off = {0, 0, 1, 4, 4, 7};
  std::vector<index_t> tok = {3, 4, 5, 6, 7, -100, 9};
  const auto x = lt::random_logits<float>(g, 7 * vocab);
  std::vector<float> logp(7), ent(7);
  std::vector<rlpt::mask_t> scored(7);
  const auto st = rlpt::sequence_logprob_entropy(rlpt::view2d<const float>(x.data(), 7, vocab), tok,
                                                 rlpt::token_layout::packed(off), {},
                                                 {.logp = logp, .entropy = ent, .scored = scored});
  CHECK(scored == std::vector<rlpt::mask_t>{0, 0, 1, 1, 0, 0, 1});
  CHECK(st.scored == 3);
  CHECK(ent[5] != 0.0f); // ignored token: entropy still reported
  RLPT_CHECK_ERROR(rlpt::sequence_logprob_entropy(rlpt::view2d<const float>(x.data(), 6, vocab), tok,
                                                  rlpt::token_layout::packed(off), {}, {.logp = logp}),
                   "rlpt.logprob.shape_mismatch", "6 rows", "7 token slots");
  tok[3] = vocab;
  RLPT_CHECK_ERROR(rlpt::sequence_logprob_entropy(rlpt::view2d<const float>(x.data(), 7, vocab), tok,
                                                  rlpt::token_layout::packed(off), {}, {.logp = logp}),
                   "rlpt.logprob.target_out_of_range", "target 50 of row 3");
}

// --- vocab parallel ----------------------------------------------------------------------------

namespace {

std::vector<index_t> split_points(index_t vocab, int k, lt::rng& g) {
  std::vector<index_t> cut = {0};
  for (int q = 1; q < k; ++q) cut.push_back(g.integer(cut.back() + 1, vocab - (k - q)));
  cut.push_back(vocab);
  return cut;
}

} // namespace

TEST_CASE("vocab-parallel over k uneven simulated shards equals the unsharded result") {
  lt::rng g(43);
  const index_t n = 23, vocab = 1537;
  auto x = lt::random_logits<float>(g, static_cast<std::size_t>(n * vocab), 3.0);
  for (index_t j = 0; j < 40; ++j)
    x[static_cast<std::size_t>(5 * vocab + 1000 + j)] = -std::numeric_limits<float>::infinity();
  std::vector<index_t> t(n);
  for (auto& v : t) v = g.integer(0, vocab - 1);
  t[4] = -100;
  const rlpt::logprob_options opt{.temperature = 0.9f};
  std::vector<float> want_lp(n), want_ent(n), want_lse(n);
  const rlpt::view2d<const float> xv(x.data(), n, vocab);
  rlpt::logprob_entropy(xv, t, {.logp = want_lp, .entropy = want_ent, .saved = {.lse = want_lse}}, opt);
  const auto dl = g.normals<float>(n), dh = g.normals<float>(n);
  std::vector<float> want_grad(x.size());
  rlpt::logprob_entropy_backward(xv, t, {.dlogp = dl, .dentropy = dh, .entropy = want_ent, .saved = {.lse = want_lse}},
                                 rlpt::view2d<float>(want_grad.data(), n, vocab), opt);
  for (const int k : {1, 2, 3, 8}) {
    const auto cut = split_points(vocab, k, g);
    lt::fake_group group(k);
    std::vector<std::vector<float>> lp(k, std::vector<float>(n)), ent(k, std::vector<float>(n)),
        lse(k, std::vector<float>(n));
    std::vector<float> grad(x.size(), 5.0f);
    std::vector<std::thread> ranks;
    for (int q = 0; q < k; ++q)
      ranks.emplace_back([&, q] {
        const index_t b = cut[static_cast<std::size_t>(q)], e = cut[static_cast<std::size_t>(q) + 1];
        const rlpt::view2d<const float> local(x.data() + b, n, e - b, vocab); // a column slice, strided
        std::vector<float> comm(static_cast<std::size_t>(rlpt::vocab_parallel_buffer_size(n)));
        rlpt::vocab_parallel_logprob_entropy(
            local, t, {.begin = b, .vocab = vocab}, comm,
            {.logp = lp[static_cast<std::size_t>(q)],
             .entropy = ent[static_cast<std::size_t>(q)],
             .saved = {.lse = lse[static_cast<std::size_t>(q)]}},
            [&](rlpt::view<float> d, rlpt::reduce_op op) { group.allreduce(q, d, op); }, opt);
        const auto qs = static_cast<std::size_t>(q);
        rlpt::vocab_parallel_backward(
            local, t, {.begin = b, .vocab = vocab},
            {.dlogp = dl, .dentropy = dh, .logp = lp[qs], .entropy = ent[qs], .saved = {.lse = lse[qs]}},
            rlpt::view2d<float>(grad.data() + b, n, e - b, vocab), opt);
      });
    for (auto& th : ranks) th.join();
    INFO(k << " shards");
    for (int q = 0; q < k; ++q) {
      RLPT_CHECK_CLOSE(lp[static_cast<std::size_t>(q)], want_lp, 1e-5, 1e-5);
      RLPT_CHECK_CLOSE(ent[static_cast<std::size_t>(q)], want_ent, 1e-5, 1e-5);
      RLPT_CHECK_CLOSE(lse[static_cast<std::size_t>(q)], want_lse, 1e-5, 1e-5);
      CHECK(lp[static_cast<std::size_t>(q)] == lp[0]); // every rank has the same bits
    }
    RLPT_CHECK_CLOSE(grad, want_grad, 1e-4, 1e-7);
  }
}

TEST_CASE("vocab-parallel errors are raised on every rank alike") {
  lt::rng g(44);
  const index_t n = 3, vocab = 10;
  auto x = lt::random_logits<float>(g, n * vocab);
  x[1 * vocab + 7] = std::numeric_limits<float>::quiet_NaN(); // only shard 1 sees it
  const std::vector<index_t> t = {1, 2, 3};
  lt::fake_group group(2);
  std::vector<std::string> ids(2);
  std::vector<std::thread> ranks;
  for (int q = 0; q < 2; ++q)
    ranks.emplace_back([&, q] {
      const index_t b = q == 0 ? 0 : 5;
      std::vector<float> comm(4 * n), lp(n);
      try {
        rlpt::vocab_parallel_logprob_entropy(
            rlpt::view2d<const float>(x.data() + b, n, 5, vocab), t, {.begin = b, .vocab = vocab}, comm, {.logp = lp},
            [&](rlpt::view<float> d, rlpt::reduce_op op) { group.allreduce(q, d, op); });
      } catch (const rlpt::error& e) {
        ids[static_cast<std::size_t>(q)] = e.id() + " " + e.message();
      }
    });
  for (auto& th : ranks) th.join();
  CHECK(ids[0].find("rlpt.logprob.nonfinite") == 0);
  CHECK(ids[1].find("rlpt.logprob.nonfinite") == 0);
  CHECK(ids[0].find("row 1") != std::string::npos);
  std::vector<float> comm(4 * n), lp(n);
  RLPT_CHECK_ERROR(rlpt::vocab_parallel_local(rlpt::view2d<const float>(x.data(), n, 5, vocab), t,
                                              {.begin = 6, .vocab = 10}, comm, lp),
                   "rlpt.logprob.bad_shard", "[6, 11)", "10 columns");
  RLPT_CHECK_ERROR(rlpt::vocab_parallel_local(rlpt::view2d<const float>(x.data(), n, 5, vocab), t,
                                              {.begin = 0, .vocab = 10}, comm, lp, {.top_k = 5}),
                   "rlpt.logprob.unsupported", "top_k 5");
}
