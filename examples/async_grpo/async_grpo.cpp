// SPDX-License-Identifier: Apache-2.0
//! @file
//! Asynchronous GRPO end to end with libtorch: the reference run of rlpt (docs/examples.md).
//!
//! Two processes. The trainer (this process) owns a small transformer policy, its autograd and
//! its Adam optimizer. The engine (the same binary re-executed with --role engine) owns its own
//! copy of the model, samples answers with temperature, returns behaviour logprobs and tags every
//! token with the policy version that sampled it. rlpt does everything in between:
//!
//!   engine results -> trajectory_builder -> staleness_buffer (rollout_buffer + DAPO filter +
//!   staleness_gate admission + pick_batch window η) -> grpo_advantages -> logprob_entropy
//!   (wrapped as a torch autograd Function) -> proximal_logprobs (decoupled PPO) ->
//!   evaluate(verl actor preset, token TIS) ->
//!   optimizer step -> sync::sender over shm_transport (bf16, delta updates) -> next version.
//!
//! Task: reverse a string of digits (length 1..max_len). The answer has a variable length and is
//! checked by a rule; no reward model. Both modes (η = 0: synchronous, η ≥ 1: asynchronous) start
//! from the same weights, seed and prompt stream; the run reports the wall time each needs to
//! reach the target accuracy on held-out prompts.
#include <rlpt/advantage.hpp>
#include <rlpt/logprob.hpp>
#include <rlpt/objective.hpp>
#include <rlpt/rollout.hpp>
#include <rlpt/staleness.hpp>
#include <rlpt/sync.hpp>

#include <torch/torch.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;
using rlpt::index_t;

//! One compute thread per process (trainer and engine each get one of the two cores): torch's
//! intra-op pool and, when the BLAS is OpenBLAS (Debian's libopenblas0-pthread), its own pool,
//! which torch's setting does not reach.
void single_threaded() {
  at::set_num_threads(1);
  using set_fn = void (*)(int);
  if (void* f = ::dlsym(RTLD_DEFAULT, "openblas_set_num_threads")) reinterpret_cast<set_fn>(f)(1);
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// --- configuration -------------------------------------------------------------------------

struct config {
  std::string role = "trainer"; // trainer | engine
  std::string mode = "both";    // sync | async | both
  int eta = 1;                  // η of the asynchronous mode
  int digits = 8;               // alphabet: digits 0..digits-1
  int max_len = 5;              // strings of 1..max_len digits
  int d_model = 64;
  int layers = 2;
  int heads = 4;
  int groups = 32;    // B: groups (prompts) per optimizer step
  int group_size = 8; // G: samples per prompt
  double lr = 3e-3;
  double entropy_coef = 0.0; // entropy bonus (verl entropy_coeff; 0 = off, verl's default)
  float temperature = 1.0f;
  int warmup_steps = 150; // supervised format warm-up (random answers of the right length)
  double target = 0.9;    // held-out accuracy that ends a mode
  int eval_every = 2;
  int max_steps = 400;
  double max_seconds = 200; // per mode
  std::uint64_t seed = 1;
  std::string wire = "bf16"; // weights on the wire and in the engine: bf16 | f32
  std::string out = ".";
  bool check = false;
  // engine only
  int fd = -1;
  std::string shm;
};

[[noreturn]] void usage(const std::string& why, int code = 2) {
  std::fprintf(code == 0 ? stdout : stderr,
               "async_grpo: %s\n"
               "usage: async_grpo [--mode sync|async|both] [--eta N] [--digits K] [--max-len L] [--d-model D]\n"
               "                  [--layers N] [--heads H] [--groups B] [--group-size G] [--lr X] [--entropy-coef X]\n"
               "                  [--temperature T] [--warmup-steps N] [--target A] [--eval-every N] [--max-steps N] "
               "[--max-seconds S]\n"
               "                  [--seed S] [--wire bf16|f32] [--out DIR] [--check]\n",
               why.c_str());
  std::exit(code);
}

config parse(int argc, char** argv) {
  config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value after " + a);
      return argv[++i];
    };
    if (a == "--help" || a == "-h") usage("asynchronous GRPO with libtorch and rlpt (docs/examples.md)", 0);
    if (a == "--role")
      c.role = next();
    else if (a == "--mode")
      c.mode = next();
    else if (a == "--eta")
      c.eta = std::stoi(next());
    else if (a == "--digits")
      c.digits = std::stoi(next());
    else if (a == "--max-len")
      c.max_len = std::stoi(next());
    else if (a == "--d-model")
      c.d_model = std::stoi(next());
    else if (a == "--layers")
      c.layers = std::stoi(next());
    else if (a == "--heads")
      c.heads = std::stoi(next());
    else if (a == "--groups")
      c.groups = std::stoi(next());
    else if (a == "--group-size")
      c.group_size = std::stoi(next());
    else if (a == "--lr")
      c.lr = std::stod(next());
    else if (a == "--entropy-coef")
      c.entropy_coef = std::stod(next());
    else if (a == "--temperature")
      c.temperature = std::stof(next());
    else if (a == "--warmup-steps")
      c.warmup_steps = std::stoi(next());
    else if (a == "--target")
      c.target = std::stod(next());
    else if (a == "--eval-every")
      c.eval_every = std::stoi(next());
    else if (a == "--max-steps")
      c.max_steps = std::stoi(next());
    else if (a == "--max-seconds")
      c.max_seconds = std::stod(next());
    else if (a == "--seed")
      c.seed = std::stoull(next());
    else if (a == "--wire")
      c.wire = next();
    else if (a == "--out")
      c.out = next();
    else if (a == "--check")
      c.check = true;
    else if (a == "--fd")
      c.fd = std::stoi(next());
    else if (a == "--shm")
      c.shm = next();
    else
      usage("unknown option " + a);
  }
  if (c.mode != "sync" && c.mode != "async" && c.mode != "both") usage("--mode must be sync, async or both");
  if (c.wire != "bf16" && c.wire != "f32") usage("--wire must be bf16 or f32");
  if (c.eta < 1) usage("--eta is the asynchronous mode's staleness bound: >= 1 (the sync mode uses 0)");
  if (c.digits < 2 || c.digits > 10 || c.max_len < 1 || c.max_len > 8)
    usage("--digits in [2, 10], --max-len in [1, 8]");
  if (c.d_model % c.heads != 0) usage("--d-model must be a multiple of --heads");
  if (c.group_size < 2 || c.groups < 1) usage("--group-size >= 2 and --groups >= 1");
  return c;
}

// --- the task: reverse a digit string ------------------------------------------------------

struct task {
  int k = 6, lmax = 4;
  [[nodiscard]] int eq() const { return k; }
  [[nodiscard]] int eos() const { return k + 1; }
  [[nodiscard]] int bos() const { return k + 2; }
  [[nodiscard]] int pad() const { return k + 3; }
  [[nodiscard]] int vocab() const { return k + 4; }
  [[nodiscard]] int max_new() const { return lmax + 1; } // the answer and its EOS
  [[nodiscard]] int max_seq() const { return 2 * lmax + 3; }

  // One prompt in five of length >= 2 is held out of training (a fixed hash of the string),
  // for evaluation; the k strings of length 1 are all trained.
  [[nodiscard]] bool held_out(const std::vector<int>& s) const {
    if (s.size() < 2) return false;
    std::uint64_t h = 0x9e3779b97f4a7c15ull ^ s.size();
    for (int d : s) h = (h ^ static_cast<std::uint64_t>(d + 1)) * 0x100000001b3ull;
    h ^= h >> 29;
    return h % 5 == 0;
  }
  [[nodiscard]] std::vector<int> draw_train(std::mt19937_64& rng) const {
    for (;;) {
      const int len = std::uniform_int_distribution<int>(1, lmax)(rng);
      std::vector<int> s(static_cast<std::size_t>(len));
      for (int& d : s) d = std::uniform_int_distribution<int>(0, k - 1)(rng);
      if (!held_out(s)) return s;
    }
  }
  //! The evaluation prompts: held-out strings of every length >= 2, at most `per_len` of each
  //! length (evenly spread over the enumeration order).
  [[nodiscard]] std::vector<std::vector<int>> held_out_set(std::size_t per_len = 128) const {
    std::vector<std::vector<int>> all;
    for (int len = 2; len <= lmax; ++len) {
      std::vector<std::vector<int>> these;
      std::vector<int> s(static_cast<std::size_t>(len), 0);
      for (;;) {
        if (held_out(s)) these.push_back(s);
        int p = len - 1;
        while (p >= 0 && ++s[static_cast<std::size_t>(p)] == k) s[static_cast<std::size_t>(p--)] = 0;
        if (p < 0) break;
      }
      const std::size_t take = std::min(per_len, these.size());
      for (std::size_t i = 0; i < take; ++i) all.push_back(these[i * these.size() / take]);
    }
    return all;
  }
  // Prompts are left-padded to one length, "BOS PAD.. d1 .. dL =", so '=' always sits at the
  // same position and the answer's i-th digit mirrors a fixed prompt position.
  [[nodiscard]] std::vector<rlpt::token_id> prompt(const std::vector<int>& s) const {
    std::vector<rlpt::token_id> p{bos()};
    p.insert(p.end(), static_cast<std::size_t>(lmax) - s.size(), pad());
    p.insert(p.end(), s.begin(), s.end());
    p.push_back(eq());
    return p;
  }
  [[nodiscard]] static std::vector<int> answer(const std::vector<int>& s) { return {s.rbegin(), s.rend()}; }

  // Rule-based reward: 1 for the exact answer followed by EOS; half a point times the share of
  // right digits for an answer of the right length; 0 otherwise (wrong length, no EOS).
  struct score {
    float reward = 0;
    bool correct = false;
  };
  [[nodiscard]] score grade(std::span<const rlpt::token_id> response, const std::vector<int>& want) const {
    if (response.empty() || response.back() != eos()) return {};
    const std::size_t n = response.size() - 1;
    if (n != want.size()) return {};
    std::size_t right = 0;
    for (std::size_t i = 0; i < n; ++i) right += response[i] == want[i] ? 1u : 0u;
    if (right == n) return {1.0f, true};
    return {0.5f * static_cast<float>(right) / static_cast<float>(n), false};
  }
};

// --- the policy: a small pre-LN transformer ------------------------------------------------

struct BlockImpl : torch::nn::Module {
  BlockImpl(int d, int h)
      : heads(h), ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        qkv(register_module("qkv", torch::nn::Linear(d, 3 * d))),
        proj(register_module("proj", torch::nn::Linear(d, d))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        fc1(register_module("fc1", torch::nn::Linear(d, 4 * d))),
        fc2(register_module("fc2", torch::nn::Linear(4 * d, d))) {}

  torch::Tensor forward(torch::Tensor x, const torch::Tensor& causal) {
    const auto n = x.size(0), t = x.size(1), d = x.size(2);
    auto q = qkv->forward(ln1->forward(x)).view({n, t, 3, heads, d / heads}).permute({2, 0, 3, 1, 4});
    auto att = torch::matmul(q[0], q[1].transpose(-1, -2)) / std::sqrt(static_cast<double>(d / heads));
    att = (att + causal.slice(0, 0, t).slice(1, 0, t)).softmax(-1);
    x = x + proj->forward(torch::matmul(att, q[2]).transpose(1, 2).reshape({n, t, d}));
    return x + fc2->forward(torch::gelu(fc1->forward(ln2->forward(x))));
  }

  std::int64_t heads;
  torch::nn::LayerNorm ln1;
  torch::nn::Linear qkv, proj;
  torch::nn::LayerNorm ln2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Block);

struct PolicyImpl : torch::nn::Module {
  PolicyImpl(const config& c, const task& tk)
      : tok(register_module("tok", torch::nn::Embedding(tk.vocab(), c.d_model))),
        pos(register_module("pos", torch::nn::Embedding(tk.max_seq(), c.d_model))),
        lnf(register_module("lnf", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})))),
        head(register_module("head", torch::nn::Linear(c.d_model, tk.vocab()))) {
    for (int l = 0; l < c.layers; ++l)
      blocks.push_back(register_module("block" + std::to_string(l), Block(c.d_model, c.heads)));
    causal = torch::full({tk.max_seq(), tk.max_seq()}, -1e9f).triu(1);
  }

  //! tokens [N, T] (int64) -> logits [N, T, V]; row t predicts token t + 1.
  torch::Tensor forward(const torch::Tensor& tokens) {
    auto x = tok->forward(tokens) + pos->forward(torch::arange(tokens.size(1), torch::kLong));
    for (auto& b : blocks) x = b->forward(x, causal);
    return head->forward(lnf->forward(x));
  }

  torch::nn::Embedding tok, pos;
  std::vector<Block> blocks;
  torch::nn::LayerNorm lnf;
  torch::nn::Linear head;
  torch::Tensor causal;
};
TORCH_MODULE(Policy);

// --- generation (engine sampling, trainer's greedy evaluation) ------------------------------

struct generated {
  std::vector<std::vector<rlpt::token_id>> tokens;         // response tokens (EOS included when emitted)
  std::vector<std::vector<float>> logprobs;                // behaviour logprob of each (at the temperature)
  std::vector<std::vector<rlpt::policy_version>> versions; // version that sampled each
};

//! Samples responses for `prompts` (temperature > 0) or decodes greedily (temperature 0).
//! `before_step()` runs before every decoding step and returns the policy version in use: the
//! engine applies a freshly synced version there, between tokens (pause_mode::keep).
template <class BeforeStep>
generated generate(Policy& model, const task& tk, const std::vector<std::vector<rlpt::token_id>>& prompts,
                   float temperature, std::mt19937_64* rng, BeforeStep&& before_step) {
  torch::NoGradGuard no_grad;
  const std::size_t n = prompts.size();
  generated g;
  g.tokens.resize(n);
  g.logprobs.resize(n);
  g.versions.resize(n);
  std::vector<std::size_t> active(n);
  std::iota(active.begin(), active.end(), std::size_t{0});
  std::uniform_real_distribution<double> unif(0.0, 1.0);
  for (int step = 0; step < tk.max_new() && !active.empty(); ++step) {
    const rlpt::policy_version version = before_step();
    std::int64_t t = 0;
    for (std::size_t i : active)
      t = std::max<std::int64_t>(t, static_cast<std::int64_t>(prompts[i].size() + g.tokens[i].size()));
    auto x = torch::full({static_cast<std::int64_t>(active.size()), t}, tk.eos(), torch::kLong);
    auto xa = x.accessor<std::int64_t, 2>();
    std::vector<std::int64_t> last(active.size());
    for (std::size_t r = 0; r < active.size(); ++r) {
      const std::size_t i = active[r];
      std::int64_t j = 0;
      for (auto v : prompts[i]) xa[static_cast<std::int64_t>(r)][j++] = v;
      for (auto v : g.tokens[i]) xa[static_cast<std::int64_t>(r)][j++] = v;
      last[r] = j - 1;
    }
    auto logits = model->forward(x);
    auto idx = torch::from_blob(last.data(), {static_cast<std::int64_t>(last.size())}, torch::kLong);
    auto rows = logits.index({torch::arange(static_cast<std::int64_t>(active.size()), torch::kLong), idx});
    if (temperature > 0.0f) rows = rows / static_cast<double>(temperature);
    auto lp = torch::log_softmax(rows, -1).contiguous();
    const float* p = lp.data_ptr<float>();
    const auto v = lp.size(1);
    std::vector<std::size_t> still;
    for (std::size_t r = 0; r < active.size(); ++r) {
      const float* row = p + static_cast<std::int64_t>(r) * v;
      std::int64_t pick = 0;
      if (temperature > 0.0f) {
        double u = unif(*rng), acc = 0.0;
        pick = v - 1;
        for (std::int64_t c = 0; c < v; ++c) {
          acc += std::exp(static_cast<double>(row[c]));
          if (u < acc) {
            pick = c;
            break;
          }
        }
      } else {
        pick = std::max_element(row, row + v) - row;
      }
      const std::size_t i = active[r];
      g.tokens[i].push_back(static_cast<rlpt::token_id>(pick));
      g.logprobs[i].push_back(row[pick]);
      g.versions[i].push_back(version);
      if (pick != tk.eos()) still.push_back(i);
    }
    active.swap(still);
  }
  return g;
}

// --- the socket between trainer and engine (prompts out, samples back) ----------------------

class channel {
public:
  explicit channel(int fd) : fd_(fd) {}
  [[nodiscard]] int fd() const { return fd_; }

  void put_i64(std::int64_t v) { put(&v, sizeof v); }
  void put_i32(std::int32_t v) { put(&v, sizeof v); }
  void put_f64(double v) { put(&v, sizeof v); }
  template <class T> void put_vec(const std::vector<T>& v) {
    put_i32(static_cast<std::int32_t>(v.size()));
    put(v.data(), v.size() * sizeof(T));
  }
  void flush() {
    std::lock_guard lock(write_mu_);
    std::size_t at = 0;
    while (at < out_.size()) {
      const ssize_t w = ::write(fd_, out_.data() + at, out_.size() - at);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) throw std::runtime_error(std::string("channel write: ") + std::strerror(errno));
      at += static_cast<std::size_t>(w);
    }
    out_.clear();
  }

  // Reads; false at end of stream (peer closed).
  bool get(void* p, std::size_t n) {
    auto* c = static_cast<char*>(p);
    std::size_t at = 0;
    while (at < n) {
      const ssize_t r = ::read(fd_, c + at, n - at);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        if (at == 0 && r == 0) return false;
        throw std::runtime_error("channel: truncated message");
      }
      at += static_cast<std::size_t>(r);
    }
    return true;
  }
  std::int64_t get_i64() {
    std::int64_t v = 0;
    need(get(&v, sizeof v));
    return v;
  }
  std::int32_t get_i32() {
    std::int32_t v = 0;
    need(get(&v, sizeof v));
    return v;
  }
  double get_f64() {
    double v = 0;
    need(get(&v, sizeof v));
    return v;
  }
  template <class T> std::vector<T> get_vec() {
    const std::int32_t n = get_i32();
    if (n < 0 || n > (1 << 20)) throw std::runtime_error("channel: bad vector size");
    std::vector<T> v(static_cast<std::size_t>(n));
    need(get(v.data(), v.size() * sizeof(T)));
    return v;
  }
  //! True when a message can be read within `ms` milliseconds.
  [[nodiscard]] bool readable(int ms) const {
    pollfd p{fd_, POLLIN, 0};
    return ::poll(&p, 1, ms) > 0;
  }

private:
  static void need(bool ok) {
    if (!ok) throw std::runtime_error("channel: truncated message");
  }
  void put(const void* p, std::size_t n) {
    const auto* c = static_cast<const char*>(p);
    out_.insert(out_.end(), c, c + n);
  }
  int fd_;
  std::vector<char> out_;
  std::mutex write_mu_;
};

enum msg : std::int32_t { msg_request = 1, msg_stop = 2, msg_result = 3 };

// --- weights on the wire -----------------------------------------------------------------

rlpt::sync::shm_options shm_opts() {
  return {.slots = 2, .slot_bytes = std::uint64_t{4} << 20, .meta_bytes = std::uint64_t{256} << 10};
}
rlpt::sync::plan_options plan_opts() { return {.bucket_bytes = std::uint64_t{4} << 20}; }

std::vector<std::pair<std::string, torch::Tensor>> named_params(Policy& m) {
  std::vector<std::pair<std::string, torch::Tensor>> v;
  for (const auto& p : m->named_parameters()) v.emplace_back(p.key(), p.value());
  return v;
}

// ============================================================================================
// The engine process: its own model copy, temperature sampling, behaviour logprobs, per-token
// versions; weights arrive through rlpt::sync::receiver on a shared-memory link.
// ============================================================================================

int run_engine(const config& c) {
  single_threaded();
  const task tk{c.digits, c.max_len};
  torch::manual_seed(c.seed);
  Policy model(c, tk);
  const auto params = named_params(model);
  std::unordered_map<std::string, std::size_t> index;
  std::vector<torch::Tensor> incoming, staged;
  for (std::size_t i = 0; i < params.size(); ++i) {
    index.emplace(params[i].first, i);
    incoming.push_back(torch::zeros_like(params[i].second));
    staged.push_back(torch::zeros_like(params[i].second));
  }

  // The receiver thread verifies and applies updates (load callback: the latest full model in
  // fp32 `incoming`); the generation thread swaps a published version in between two tokens.
  std::mutex mu;
  rlpt::policy_version staged_version = -1;
  rlpt::sync::shm_transport link(c.shm, rlpt::sync::role::receiver);
  rlpt::sync::receiver rx(link, [&](const rlpt::sync::tensor_view& t) {
    const auto it = index.find(std::string(t.name));
    if (it == index.end()) throw std::runtime_error("engine: unknown tensor " + std::string(t.name));
    const std::vector<std::int64_t> shape(t.shape.begin(), t.shape.end());
    const auto dt = t.dtype == rlpt::sync::wire_dtype::bf16 ? torch::kBFloat16 : torch::kFloat;
    // from_blob does not own: copy_ converts (bf16 -> fp32) into the engine's own tensor.
    incoming[it->second].copy_(torch::from_blob(const_cast<std::byte*>(t.bytes.data()), shape, dt));
  });
  std::atomic<bool> stop{false};
  std::thread receiver_thread([&] {
    while (!stop.load()) {
      // poll(0) returns at once when no update is in progress (and drives one that started to its
      // end); sleeping 1 ms between checks keeps this thread off the generation thread's core.
      const rlpt::sync::update u = rx.poll(std::chrono::milliseconds(0));
      if (!u.published() && !u.failed()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (u.published()) {
        std::lock_guard lock(mu);
        for (std::size_t i = 0; i < staged.size(); ++i) staged[i].copy_(incoming[i]);
        staged_version = static_cast<rlpt::policy_version>(u.version);
      } else if (u.failed()) {
        std::fprintf(stderr, "engine: weight sync %llu failed: %s (%s); still serving %llu\n",
                     static_cast<unsigned long long>(u.version), u.reason.c_str(), u.error_id.c_str(),
                     static_cast<unsigned long long>(rx.version()));
      }
    }
  });

  rlpt::policy_version current = -1;
  auto apply = [&]() -> rlpt::policy_version {
    std::lock_guard lock(mu);
    if (staged_version > current) {
      torch::NoGradGuard no_grad;
      for (std::size_t i = 0; i < staged.size(); ++i) params[i].second.copy_(staged[i]);
      current = staged_version;
    }
    return current;
  };

  struct request {
    std::int64_t gid;
    rlpt::policy_version version;
    std::int32_t n;
    std::vector<rlpt::token_id> prompt;
  };
  channel ch(c.fd);
  std::deque<request> pending;
  std::mt19937_64 rng(c.seed * 0x9e3779b97f4a7c15ull + 7);
  double busy = 0;
  bool stopping = false;
  int rc = 0;
  try {
    for (;;) {
      // Idle: wait up to 2 ms for work. Busy: keep collecting while requests still arrive (within
      // 1 ms), so that a burst of admissions becomes one generation batch.
      while (!stopping && ch.readable(pending.empty() ? 2 : 1)) {
        std::int32_t type = 0;
        if (!ch.get(&type, sizeof type) || type == msg_stop) {
          stopping = true;
          break;
        }
        if (type != msg_request) throw std::runtime_error("engine: unexpected message " + std::to_string(type));
        request r;
        r.gid = ch.get_i64();
        r.version = ch.get_i32();
        r.n = ch.get_i32();
        r.prompt = ch.get_vec<rlpt::token_id>();
        pending.push_back(std::move(r));
      }
      if (stopping) break;
      if (pending.empty()) continue;
      std::vector<request> batch(std::make_move_iterator(pending.begin()), std::make_move_iterator(pending.end()));
      pending.clear();
      // Never sample a request with weights older than the version it was dispatched at.
      rlpt::policy_version need = 0;
      for (const auto& r : batch) need = std::max(need, r.version);
      const auto wait0 = clock_type::now();
      while (apply() < need) {
        if (seconds_since(wait0) > 60)
          throw std::runtime_error("engine: version " + std::to_string(need) + " never arrived");
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      const auto t0 = clock_type::now();
      std::vector<std::vector<rlpt::token_id>> prompts;
      for (const auto& r : batch)
        for (std::int32_t k = 0; k < r.n; ++k) prompts.push_back(r.prompt);
      const generated g = generate(model, tk, prompts, c.temperature, &rng, apply);
      busy += seconds_since(t0);
      std::size_t at = 0;
      for (const auto& r : batch) {
        ch.put_i32(msg_result);
        ch.put_i64(r.gid);
        ch.put_i32(r.n);
        ch.put_f64(busy);
        for (std::int32_t k = 0; k < r.n; ++k, ++at) {
          ch.put_vec(g.tokens[at]);
          ch.put_vec(g.logprobs[at]);
          ch.put_vec(g.versions[at]);
        }
      }
      ch.flush();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "engine: %s\n", e.what());
    rc = 1;
  }
  stop = true;
  receiver_thread.join();
  return rc;
}

// ============================================================================================
// The trainer process
// ============================================================================================

//! rlpt's logprob/entropy kernel as a torch autograd function: logits [N, V] and targets [N]
//! (ignore_index -100 = not scored) -> (logp [N], entropy [N]); the backward is rlpt's.
struct LogprobFn : torch::autograd::Function<LogprobFn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits,
                                                const torch::Tensor& targets, double temperature) {
    auto z = logits.contiguous();
    const index_t n = z.size(0), v = z.size(1);
    auto logp = torch::empty({n}, torch::kFloat), ent = torch::empty({n}, torch::kFloat),
         lse = torch::empty({n}, torch::kFloat);
    rlpt::logprob_entropy(rlpt::view2d<const float>(z.data_ptr<float>(), n, v),
                          rlpt::view<const index_t>(targets.data_ptr<std::int64_t>(), n),
                          rlpt::logprob_outputs{.logp = {logp.data_ptr<float>(), n},
                                                .entropy = {ent.data_ptr<float>(), n},
                                                .saved = {.lse = {lse.data_ptr<float>(), n}}},
                          {.temperature = static_cast<float>(temperature)});
    ctx->save_for_backward({z, targets, ent, lse});
    ctx->saved_data["temperature"] = temperature;
    return {logp, ent};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& z = saved[0];
    const index_t n = z.size(0), v = z.size(1);
    const torch::Tensor dlogp = grads[0].defined() ? grads[0].contiguous() : torch::zeros({n}, torch::kFloat);
    const torch::Tensor dent = grads[1].defined() ? grads[1].contiguous() : torch::Tensor();
    auto dz = torch::empty_like(z);
    rlpt::logprob_entropy_backward(
        rlpt::view2d<const float>(z.data_ptr<float>(), n, v),
        rlpt::view<const index_t>(saved[1].data_ptr<std::int64_t>(), n),
        {.dlogp = rlpt::view<const float>(dlogp.data_ptr<float>(), n),
         .dentropy = dent.defined() ? rlpt::view<const float>(dent.data_ptr<float>(), n) : rlpt::view<const float>{},
         .entropy = rlpt::view<const float>(saved[2].data_ptr<float>(), n),
         .saved = {.lse = {saved[3].data_ptr<float>(), n}}},
        rlpt::view2d<float>(dz.data_ptr<float>(), n, v),
        {.temperature = static_cast<float>(ctx->saved_data["temperature"].toDouble())});
    return {dz, torch::Tensor(), torch::Tensor()};
  }
};

//! One training step's numbers (a CSV row).
struct step_row {
  std::string mode;
  int eta = 0, step = 0, version = 0;
  double wall_s = 0;
  double gen_reward = 0, gen_acc = 0; // over every sample the engine returned since the last step
  double batch_reward = 0;            // over the trained (DAPO-kept) samples
  double heldout = -1;                // greedy accuracy on held-out prompts (-1: not evaluated)
  double stale_mean = 0;
  int stale_max = 0;
  std::array<int, 4> stale{}; // groups trained at staleness 0, 1, 2, >= 3
  double sync_ms = 0;
  std::uint64_t wire_bytes = 0, dense_bytes = 0, changed = 0, elements = 0;
  bool delta = false;
  double train_ms = 0, wait_ms = 0;
  double loss = 0, entropy = 0, is_weight_max = 0;
  std::int64_t filtered = 0;
};

struct mode_summary {
  std::string name;
  int eta = 0;
  int steps = 0;
  double wall = 0, to_target = -1;
  int target_step = -1;
  double initial_acc = 0, final_acc = 0;
  std::int64_t samples = 0, groups = 0, filtered = 0, trained = 0;
  rlpt::staleness_histogram hist;
  double sync_ms = 0, wire_mb = 0, dense_mb = 0, changed_frac = 0;
  double trainer_wait = 0, engine_busy = 0, train_s = 0, elapsed = 0;
  std::vector<double> rewards; // rollout reward per step

  // Mean rollout reward over the first / last (up to) three steps.
  [[nodiscard]] double reward_at(bool last) const {
    const std::size_t n = std::min<std::size_t>(3, rewards.size());
    if (n == 0) return 0;
    const auto b = last ? rewards.end() - static_cast<std::ptrdiff_t>(n) : rewards.begin();
    return std::accumulate(b, b + static_cast<std::ptrdiff_t>(n), 0.0) / static_cast<double>(n);
  }
  std::vector<std::string> failures;
};

//! Greedy accuracy on the held-out prompts: the mean over answer lengths of each length's
//! accuracy (lengths weigh equally, as in the training distribution; long strings dominate the
//! held-out set by count).
double evaluate_heldout(Policy& model, const task& tk, const std::vector<std::vector<int>>& heldout) {
  std::vector<std::vector<rlpt::token_id>> prompts;
  for (const auto& s : heldout) prompts.push_back(tk.prompt(s));
  const generated g = generate(model, tk, prompts, 0.0f, nullptr, [] { return rlpt::policy_version{0}; });
  std::map<std::size_t, std::pair<double, double>> by_len; // length -> (right, total)
  for (std::size_t i = 0; i < heldout.size(); ++i) {
    auto& [right, total] = by_len[heldout[i].size()];
    right += tk.grade(g.tokens[i], task::answer(heldout[i])).correct ? 1.0 : 0.0;
    total += 1.0;
  }
  double acc = 0;
  for (const auto& [len, rt] : by_len) acc += rt.first / rt.second;
  return acc / static_cast<double>(by_len.size());
}

//! Supervised format warm-up: answers of the right length made of random digits, then EOS. The
//! policy learns the output format (length, EOS), not the reversal: it starts near chance.
double warmup(Policy& model, const config& c, const task& tk) {
  const auto t0 = clock_type::now();
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(c.lr));
  std::mt19937_64 rng(c.seed ^ 0x5eedull);
  const int rows = 64;
  for (int it = 0; it < c.warmup_steps; ++it) {
    auto x = torch::full({rows, tk.max_seq()}, tk.eos(), torch::kLong);
    auto y = torch::full({rows, tk.max_seq()}, -100, torch::kLong);
    auto xa = x.accessor<std::int64_t, 2>();
    auto ya = y.accessor<std::int64_t, 2>();
    for (int r = 0; r < rows; ++r) {
      const auto s = tk.draw_train(rng);
      auto seq = tk.prompt(s);
      const auto plen = static_cast<std::int64_t>(seq.size());
      for (std::size_t k = 0; k < s.size(); ++k) seq.push_back(std::uniform_int_distribution<int>(0, tk.k - 1)(rng));
      seq.push_back(tk.eos());
      for (std::int64_t j = 0; j < static_cast<std::int64_t>(seq.size()); ++j) {
        xa[r][j] = seq[static_cast<std::size_t>(j)];
        if (j >= plen) ya[r][j - 1] = seq[static_cast<std::size_t>(j)];
      }
    }
    auto logits = model->forward(x);
    auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, tk.vocab()}), y.reshape({-1}));
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  return seconds_since(t0);
}

std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw std::runtime_error("cannot read /proc/self/exe");
  return std::string(buf, static_cast<std::size_t>(n));
}

//! Starts the engine: this binary again, with --role engine, on one end of a socket pair.
pid_t spawn_engine(const config& c, const std::string& shm, int child_fd) {
  const std::string exe = self_exe();
  std::vector<std::string> args = {exe,
                                   "--role",
                                   "engine",
                                   "--fd",
                                   std::to_string(child_fd),
                                   "--shm",
                                   shm,
                                   "--digits",
                                   std::to_string(c.digits),
                                   "--max-len",
                                   std::to_string(c.max_len),
                                   "--d-model",
                                   std::to_string(c.d_model),
                                   "--layers",
                                   std::to_string(c.layers),
                                   "--heads",
                                   std::to_string(c.heads),
                                   "--temperature",
                                   std::to_string(c.temperature),
                                   "--seed",
                                   std::to_string(c.seed)};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::fcntl(child_fd, F_SETFD, 0); // keep it open across exec
    ::execv(exe.c_str(), argv.data());
    ::_exit(127);
  }
  return pid;
}

mode_summary run_mode(const config& c, const task& tk, const std::vector<torch::Tensor>& init, int eta,
                      const std::string& name, const std::vector<std::vector<int>>& heldout,
                      std::vector<step_row>& rows) {
  mode_summary sum;
  sum.name = name;
  sum.eta = eta;
  const int B = c.groups, G = c.group_size;

  torch::manual_seed(c.seed);
  Policy model(c, tk);
  const auto params = named_params(model);
  {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params.size(); ++i) params[i].second.copy_(init[i]);
  }
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(c.lr));

  // --- weight sync: the engine serves bf16 weights (as engines do); deltas carry only the
  // elements whose bits changed since the last acknowledged version.
  const bool bf16 = c.wire == "bf16";
  std::vector<torch::Tensor> wire;
  std::vector<rlpt::sync::tensor_ref> refs;
  for (const auto& [pname, p] : params) {
    wire.push_back(torch::empty(p.sizes(), bf16 ? torch::kBFloat16 : torch::kFloat));
    wire.back().copy_(p.detach());
    refs.push_back({pname, bf16 ? rlpt::sync::wire_dtype::bf16 : rlpt::sync::wire_dtype::f32,
                    std::vector<std::int64_t>(p.sizes().begin(), p.sizes().end()), wire.back().data_ptr()});
  }
  const std::string shm = "rlpt-async-grpo-" + std::to_string(::getpid()) + "-" + name;
  rlpt::sync::shm_transport link(shm, rlpt::sync::role::sender, shm_opts());
  rlpt::sync::sender tx(link, rlpt::sync::plan(refs, plan_opts()), refs, {.delta = true});

  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    throw std::runtime_error(std::string("socketpair: ") + std::strerror(errno));
  const pid_t engine = spawn_engine(c, shm, sv[1]);
  ::close(sv[1]);
  channel ch(sv[0]);
  tx.publish(0); // version 0: dense, waits for the engine to attach

  // --- the rollout path: gate (admission, η) + rollout buffer (groups, DAPO filter) + window.
  rlpt::staleness_metrics metrics;
  rlpt::staleness_gate gate({.max_staleness = eta, .batch_groups = B, .metrics = &metrics});
  rlpt::staleness_buffer sb(gate,
                            {.capacity_groups = (eta + 3) * B, .group_size = G, .filters = {rlpt::filters::dapo()}},
                            {.select = {.max_staleness = eta, .on_stale = rlpt::stale_policy::wait}});

  struct flight {
    rlpt::ticket t;
    std::vector<int> digits;
  };
  std::mutex mu;
  std::unordered_map<std::int64_t, flight> inflight;
  struct gen_stats {
    std::int64_t samples = 0, correct = 0, groups = 0, pushed = 0;
    double reward = 0, engine_busy = 0;
  } gs;
  std::string collector_error;

  std::thread dispatcher([&] {
    std::mt19937_64 prompt_rng(c.seed * 1000003ull + 1); // the same prompt stream in every mode
    std::int64_t gid = 0;
    while (rlpt::ticket t = gate.admit()) { // blocks until the gate has capacity; empty once closed
      auto s = tk.draw_train(prompt_rng);
      const auto prompt = tk.prompt(s);
      {
        std::lock_guard lock(mu);
        inflight.emplace(gid, flight{t, std::move(s)});
      }
      ch.put_i32(msg_request);
      ch.put_i64(gid++);
      ch.put_i32(t.version); // the dispatch version: the engine must sample with weights >= it
      ch.put_i32(G);
      ch.put_vec(prompt);
      ch.flush();
    }
  });

  std::thread collector([&] {
    try {
      for (;;) {
        std::int32_t type = 0;
        if (!ch.get(&type, sizeof type)) break;
        if (type != msg_result) throw std::runtime_error("trainer: unexpected message " + std::to_string(type));
        const std::int64_t gid = ch.get_i64();
        const std::int32_t n = ch.get_i32();
        const double busy = ch.get_f64();
        flight f;
        {
          std::lock_guard lock(mu);
          auto it = inflight.find(gid);
          if (it == inflight.end())
            throw std::runtime_error("trainer: result for unknown group " + std::to_string(gid));
          f = std::move(it->second);
          inflight.erase(it);
        }
        const auto want = task::answer(f.digits);
        const auto prompt = tk.prompt(f.digits);
        std::vector<rlpt::trajectory> records;
        double rsum = 0;
        std::int64_t right = 0;
        for (std::int32_t k = 0; k < n; ++k) {
          const auto tokens = ch.get_vec<rlpt::token_id>();
          const auto logprobs = ch.get_vec<float>();
          const auto versions = ch.get_vec<rlpt::policy_version>();
          const task::score s = tk.grade(tokens, want);
          rsum += s.reward;
          right += s.correct ? 1 : 0;
          rlpt::trajectory_builder b(gid, prompt); // prompt: loss mask 0, version -1
          b.model(tokens, logprobs,
                  rlpt::view<const rlpt::policy_version>(versions)); // sampled: trained, per-token versions
          b.reward(s.reward);
          rlpt::trajectory t = std::move(b).finish();
          t.sample_index = k;
          records.push_back(std::move(t));
        }
        {
          std::lock_guard lock(mu);
          gs.samples += n;
          gs.correct += right;
          gs.reward += rsum;
          gs.groups += 1;
          gs.engine_busy = busy;
        }
        // The group's last record accepts the ticket in the gate; after close() nothing goes in.
        const index_t in = sb.push_group(f.t, records);
        std::lock_guard lock(mu);
        gs.pushed += in == n ? 1 : 0;
      }
    } catch (const std::exception& e) {
      collector_error = e.what();
      sb.close();
    }
  });

  const rlpt::objective obj = rlpt::compat::verl::actor(
      {.loss_mode = "vanilla", .loss_agg_mode = "token-mean", .entropy_coeff = c.entropy_coef},
      rlpt::compat::verl::rollout_correction("token", "2.0"));
  auto fail = [&](std::string what) {
    if (sum.failures.size() < 20) sum.failures.push_back(std::move(what));
  };

  const auto start = clock_type::now();
  double eval_s = 0;
  auto wall = [&] { return seconds_since(start) - eval_s; };
  {
    const auto te = clock_type::now();
    sum.initial_acc = evaluate_heldout(model, tk, heldout);
    eval_s += seconds_since(te);
  }
  gen_stats last_gs;
  double gen_reward = 0, gen_acc = 0;
  std::int64_t last_filtered = 0;
  double sync_total = 0;
  std::uint64_t wire_total = 0, dense_total = 0, changed_total = 0, elements_total = 0;
  double acc_now = sum.initial_acc;

  for (int step = 1; step <= c.max_steps; ++step) {
    const auto tw = clock_type::now();
    rlpt::rollout_batch batch = sb.pop(); // B groups, none older than η versions
    const double wait_s = seconds_since(tw);
    if (batch.num_groups() != B) {
      fail("step " + std::to_string(step) + ": got " + std::to_string(batch.num_groups()) + " groups" +
           (collector_error.empty() ? "" : " (" + collector_error + ")"));
      break;
    }
    const auto t_train = clock_type::now();
    const rlpt::policy_version v = gate.version();
    step_row row;
    row.mode = name;
    row.eta = eta;
    row.step = step;
    row.version = v;
    row.wait_ms = wait_s * 1e3;

    // Bookkeeping: staleness of every trained group (v - dispatch version) and of every token.
    double stale_sum = 0;
    for (const auto& gi : batch.group_infos()) {
      const int s = v - gi.head_version;
      stale_sum += s;
      row.stale_max = std::max(row.stale_max, s);
      row.stale[static_cast<std::size_t>(std::min(s, 3))] += 1;
      sum.hist.add(s);
      if (s > eta || s < 0 || gi.tail_version > v)
        fail("step " + std::to_string(step) + ": group " + std::to_string(gi.id) + " versions [" +
             std::to_string(gi.head_version) + ", " + std::to_string(gi.tail_version) + "] trained at version " +
             std::to_string(v) + " with eta " + std::to_string(eta));
    }
    row.stale_mean = stale_sum / B;
    const auto toks = batch.tokens();
    const auto lmask = batch.loss_mask();
    const auto vers = batch.versions();
    for (index_t j = 0; j < batch.num_tokens(); ++j)
      if (lmask[j] != 0 && (v - vers[j] > eta || vers[j] > v || (eta == 0 && vers[j] != v)))
        fail("step " + std::to_string(step) + ": token " + std::to_string(j) + " of version " +
             std::to_string(vers[j]) + " trained at version " + std::to_string(v));

    // GRPO advantages over the batch's groups (verl's conventions).
    const index_t N = batch.size();
    const std::vector<float> rewards = batch.reward_column(0);
    std::vector<float> adv(static_cast<std::size_t>(N));
    (void)rlpt::grpo_advantages(rewards, batch.groups(), adv, rlpt::compat::verl::grpo());
    row.batch_reward = std::accumulate(rewards.begin(), rewards.end(), 0.0) / static_cast<double>(N);

    // Trainer forward on the padded batch; logits rows gathered into the batch's packed order.
    const auto offs = batch.offsets();
    std::int64_t tmax = 0;
    for (index_t i = 0; i < N; ++i) tmax = std::max<std::int64_t>(tmax, offs[i + 1] - offs[i]);
    const index_t ntok = batch.num_tokens();
    auto x = torch::full({N, tmax}, tk.eos(), torch::kLong);
    auto xa = x.accessor<std::int64_t, 2>();
    std::vector<std::int64_t> rowsel(static_cast<std::size_t>(ntok)), targets(static_cast<std::size_t>(ntok));
    for (index_t i = 0; i < N; ++i)
      for (index_t j = offs[i]; j < offs[i + 1]; ++j) {
        const index_t p = j - offs[i];
        xa[i][p] = toks[j];
        // token p is predicted by logits row p - 1 of its own sequence; untrained tokens are not scored
        rowsel[static_cast<std::size_t>(j)] = i * tmax + std::max<index_t>(p - 1, 0);
        targets[static_cast<std::size_t>(j)] = lmask[j] != 0 ? toks[j] : -100;
      }
    auto logits = model->forward(x).reshape({N * tmax, tk.vocab()});
    auto scored = logits.index_select(0, torch::from_blob(rowsel.data(), {ntok}, torch::kLong));
    auto out = LogprobFn::apply(scored, torch::from_blob(targets.data(), {ntok}, torch::kLong),
                                static_cast<double>(c.temperature));
    const torch::Tensor logp = out[0];
    const torch::Tensor lp = logp.detach().contiguous(), ent = out[1].detach().contiguous();

    // Decoupled PPO (AReaL): the proximal policy is one version behind the trainer, its
    // log-probs approximated from behaviour and current ones by the tokens' versions (no extra
    // forward pass). With η <= 1 every trained token is at most one version old, so the proximal
    // policy is the behaviour policy itself and the PPO clip is a trust region around it.
    const rlpt::view<const float> lpv(lp.data_ptr<float>(), ntok);
    std::vector<float> prox(static_cast<std::size_t>(ntok));
    (void)rlpt::proximal_logprobs(batch.logprobs(), lpv, vers, lmask, v, prox, {.lag = 1});

    // The policy objective: PPO clip against the proximal policy, token-level truncated
    // importance weights behaviour -> proximal (verl TIS, cap 2), token-mean over the step's
    // trained tokens.
    std::vector<float> grad(static_cast<std::size_t>(ntok)), grad_ent(static_cast<std::size_t>(ntok));
    const rlpt::objective_inputs in{.layout = batch.layout(),
                                    .mask = lmask,
                                    .logp = lpv,
                                    .old_logp = prox,
                                    .behav_logp = batch.logprobs(),
                                    .seq_adv = adv,
                                    .entropy = rlpt::view<const float>(ent.data_ptr<float>(), ntok)};
    const rlpt::objective_result r = rlpt::evaluate(obj, in, rlpt::objective_grads{.logp = grad, .entropy = grad_ent});
    row.loss = r.loss;
    row.entropy = r.entropy_mean;
    row.is_weight_max = r.is_weight_max;

    opt.zero_grad();
    // d loss / d logp (and d loss / d entropy) from rlpt flow back through rlpt's logprob backward.
    if (c.entropy_coef != 0.0)
      torch::autograd::backward({logp, out[1]}, {torch::from_blob(grad.data(), {ntok}, torch::kFloat),
                                                 torch::from_blob(grad_ent.data(), {ntok}, torch::kFloat)});
    else
      torch::autograd::backward({logp}, {torch::from_blob(grad.data(), {ntok}, torch::kFloat)});
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    opt.step();
    row.train_ms = seconds_since(t_train) * 1e3;
    sum.train_s += seconds_since(t_train);

    // Weight sync to the engine, then the next version opens admission for it.
    {
      torch::NoGradGuard no_grad;
      for (std::size_t i = 0; i < params.size(); ++i) wire[i].copy_(params[i].second);
    }
    const rlpt::sync::publish_result pr = tx.publish(static_cast<std::uint64_t>(v + 1));
    sb.publish();
    row.sync_ms = pr.seconds * 1e3;
    row.wire_bytes = pr.wire_bytes;
    row.dense_bytes = pr.dense_bytes;
    row.delta = pr.delta;
    row.changed = pr.stats.changed;
    row.elements = pr.stats.elements;
    sync_total += pr.seconds;
    wire_total += pr.wire_bytes;
    dense_total += pr.dense_bytes;
    changed_total += pr.stats.changed;
    elements_total += pr.stats.elements;

    // What the engine produced since the last step (every sample, before the DAPO filter).
    {
      std::lock_guard lock(mu);
      const std::int64_t ns = gs.samples - last_gs.samples;
      if (ns > 0) { // else (async: this batch was generated before the last step) keep the last values
        gen_reward = (gs.reward - last_gs.reward) / static_cast<double>(ns);
        gen_acc = static_cast<double>(gs.correct - last_gs.correct) / static_cast<double>(ns);
      }
      row.gen_reward = gen_reward;
      row.gen_acc = gen_acc;
      last_gs = gs;
    }
    const rlpt::buffer_stats bs = sb.buffer().stats();
    const std::int64_t filtered = bs.evicted_by(rlpt::evict_reason::filtered).groups;
    row.filtered = filtered - last_filtered;
    last_filtered = filtered;

    if (step % c.eval_every == 0) {
      const auto te = clock_type::now();
      acc_now = evaluate_heldout(model, tk, heldout);
      eval_s += seconds_since(te);
      row.heldout = acc_now;
    }
    row.wall_s = wall();
    sum.rewards.push_back(row.gen_reward);
    rows.push_back(row);
    sum.steps = step;

    const int filled = static_cast<int>(std::lround(std::clamp(acc_now / c.target, 0.0, 1.0) * 20));
    std::printf(
        "[%-5s eta=%d] step %3d |%s%s| reward %.3f acc %.3f | held-out %.3f | stale %d:%d %d:%d %d:%d | sync %5.2f ms "
        "%s %4.0f%% | train %4.0f ms wait %4.0f ms | %6.1f s\n",
        name.c_str(), eta, step, std::string(static_cast<std::size_t>(filled), '#').c_str(),
        std::string(static_cast<std::size_t>(20 - filled), '.').c_str(), row.gen_reward, row.gen_acc, acc_now, 0,
        row.stale[0], 1, row.stale[1], 2, row.stale[2] + row.stale[3], row.sync_ms, row.delta ? "delta" : "dense",
        100.0 * static_cast<double>(row.wire_bytes) / static_cast<double>(std::max<std::uint64_t>(row.dense_bytes, 1)),
        row.train_ms, row.wait_ms, row.wall_s);
    std::fflush(stdout);

    if (row.heldout >= c.target && sum.to_target < 0) {
      sum.to_target = row.wall_s;
      sum.target_step = step;
      break;
    }
    if (row.wall_s > c.max_seconds) break;
  }
  sum.wall = wall();
  sum.elapsed = seconds_since(start);
  {
    const auto te = clock_type::now();
    sum.final_acc = evaluate_heldout(model, tk, heldout);
    eval_s += seconds_since(te);
  }

  // --- shutdown: close admission and the buffer, stop the engine, reap it.
  sb.close();
  dispatcher.join();
  try {
    ch.put_i32(msg_stop);
    ch.flush();
  } catch (const std::exception&) {
    // the engine already exited: the collector reports why
  }
  collector.join();
  int status = 0;
  ::waitpid(engine, &status, 0);
  ::close(sv[0]);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) fail("engine exited with status " + std::to_string(status));
  if (!collector_error.empty()) fail("collector: " + collector_error);

  // --- the books: nothing lost, nothing counted twice.
  const rlpt::buffer_stats bs = sb.buffer().stats();
  const rlpt::gate_counts gc = gate.counts();
  if (!bs.balanced())
    fail("buffer accounting: inserted " + std::to_string(bs.inserted.records) + " != consumed " +
         std::to_string(bs.consumed.records) + " + evicted " + std::to_string(bs.evicted_total().records) +
         " + resident " + std::to_string(bs.resident.records));
  if (!gc.balanced()) fail("gate accounting does not balance");
  if (bs.consumed.groups != static_cast<index_t>(sum.steps) * B || gc.consumed != static_cast<index_t>(sum.steps) * B)
    fail("consumed groups: buffer " + std::to_string(bs.consumed.groups) + ", gate " + std::to_string(gc.consumed) +
         ", expected " + std::to_string(sum.steps * B));
  if (bs.inserted.groups != gs.pushed)
    fail("groups pushed " + std::to_string(gs.pushed) + " but the buffer saw " + std::to_string(bs.inserted.groups));
  if (gc.admitted != gs.groups + static_cast<index_t>(gc.running))
    fail("tickets admitted " + std::to_string(gc.admitted) + " != groups returned " + std::to_string(gs.groups) +
         " + still running " + std::to_string(gc.running));
  if (sum.hist.at(0) + sum.hist.at(1) + sum.hist.at(2) + sum.hist.at(3) + sum.hist.at(4) == 0 && sum.steps > 0)
    fail("empty staleness histogram");

  sum.samples = gs.samples;
  sum.groups = gs.groups;
  sum.filtered = bs.evicted_by(rlpt::evict_reason::filtered).groups;
  sum.trained = bs.consumed.groups;
  sum.sync_ms = sum.steps > 0 ? sync_total * 1e3 / sum.steps : 0;
  sum.wire_mb = static_cast<double>(wire_total) / 1e6;
  sum.dense_mb = static_cast<double>(dense_total) / 1e6;
  sum.changed_frac = elements_total > 0 ? static_cast<double>(changed_total) / static_cast<double>(elements_total) : 0;
  sum.trainer_wait = sum.wall > 0 ? 1.0 - sum.train_s / sum.wall : 0;
  sum.engine_busy = gs.engine_busy / std::max(1e-9, sum.elapsed);
  return sum;
}

void write_csv(const std::filesystem::path& path, const std::vector<step_row>& rows) {
  std::ofstream f(path);
  f << "mode,eta,step,version,wall_s,gen_reward,gen_acc,batch_reward,heldout_acc,stale_mean,stale_max,stale_0,stale_1,"
       "stale_2,stale_3plus,sync_ms,wire_bytes,dense_bytes,delta,changed,elements,train_ms,wait_ms,loss,entropy,"
       "is_weight_max,filtered_groups\n";
  for (const auto& r : rows) {
    f << r.mode << ',' << r.eta << ',' << r.step << ',' << r.version << ',' << r.wall_s << ',' << r.gen_reward << ','
      << r.gen_acc << ',' << r.batch_reward << ',';
    if (r.heldout >= 0) f << r.heldout;
    f << ',' << r.stale_mean << ',' << r.stale_max << ',' << r.stale[0] << ',' << r.stale[1] << ',' << r.stale[2] << ','
      << r.stale[3] << ',' << r.sync_ms << ',' << r.wire_bytes << ',' << r.dense_bytes << ',' << (r.delta ? 1 : 0)
      << ',' << r.changed << ',' << r.elements << ',' << r.train_ms << ',' << r.wait_ms << ',' << r.loss << ','
      << r.entropy << ',' << r.is_weight_max << ',' << r.filtered << '\n';
  }
}

void print_summary(const std::vector<mode_summary>& ms, const config& c) {
  std::printf("\n%-26s", "");
  for (const auto& m : ms) std::printf(" | %-16s", (m.name + " (eta=" + std::to_string(m.eta) + ")").c_str());
  std::printf("\n");
  auto line = [&](const char* label, auto fn) {
    std::printf("%-26s", label);
    for (const auto& m : ms) std::printf(" | %-16s", fn(m).c_str());
    std::printf("\n");
  };
  auto f = [](const char* fmt, double v) {
    char b[64];
    std::snprintf(b, sizeof b, fmt, v);
    return std::string(b);
  };
  const std::string target = "time to " + f("%.0f%%", 100 * c.target) + " held-out";
  line(target.c_str(),
       [&](const mode_summary& m) { return m.to_target >= 0 ? f("%.1f s", m.to_target) : std::string("not reached"); });
  line("steps to target",
       [&](const mode_summary& m) { return m.target_step >= 0 ? std::to_string(m.target_step) : std::string("-"); });
  line("held-out acc start / end",
       [&](const mode_summary& m) { return f("%.3f", m.initial_acc) + " / " + f("%.3f", m.final_acc); });
  line("steps, wall time", [&](const mode_summary& m) { return std::to_string(m.steps) + ", " + f("%.1f s", m.wall); });
  line("samples generated", [&](const mode_summary& m) { return std::to_string(m.samples); });
  line("groups: DAPO-filtered",
       [&](const mode_summary& m) { return std::to_string(m.filtered) + " of " + std::to_string(m.groups); });
  line("staleness of trained grps", [&](const mode_summary& m) { return m.hist.to_string(); });
  line("sync per step", [&](const mode_summary& m) { return f("%.2f ms", m.sync_ms); });
  line("sync wire / dense bytes",
       [&](const mode_summary& m) { return f("%.1f", m.wire_mb) + " / " + f("%.1f MB", m.dense_mb); });
  line("wire elements changed", [&](const mode_summary& m) { return f("%.1f%%/step", 100 * m.changed_frac); });
  line("trainer idle (waits)", [&](const mode_summary& m) { return f("%.0f%%", 100 * m.trainer_wait); });
  line("engine busy", [&](const mode_summary& m) { return f("%.0f%%", 100 * m.engine_busy); });
  line("bookkeeping",
       [&](const mode_summary& m) { return m.failures.empty() ? std::string("ok") : std::string("FAILED"); });
  if (ms.size() == 2 && ms[0].to_target > 0 && ms[1].to_target > 0) {
    const double r = ms[0].to_target / ms[1].to_target;
    std::printf("\nwall time to the target: sync %.1f s, async %.1f s: async is %.2fx %s\n", ms[0].to_target,
                ms[1].to_target, r >= 1 ? r : 1 / r, r >= 1 ? "faster" : "slower");
  }
}

} // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  config c = parse(argc, argv);
  try {
    if (c.role == "engine") return run_engine(c);
    if (c.role != "trainer") usage("--role must be trainer or engine");
    single_threaded(); // one core for the trainer, one for the engine
    if (c.check) c.max_seconds = std::min(c.max_seconds, 30.0);
    const task tk{c.digits, c.max_len};
    const auto heldout = tk.held_out_set();
    std::filesystem::create_directories(c.out);

    torch::manual_seed(c.seed);
    Policy model(c, tk);
    const double warm_s = warmup(model, c, tk);
    std::vector<torch::Tensor> init;
    for (const auto& p : model->parameters()) init.push_back(p.detach().clone());
    std::printf(
        "rlpt async GRPO: reverse strings of 1-%d digits (0-%d); policy d_model %d, %d layers, %lld parameters\n"
        "%zu held-out prompts; B = %d groups x G = %d samples per step; format warm-up %d steps (%.1f s); "
        "held-out accuracy after warm-up %.3f\n\n",
        c.max_len, c.digits - 1, c.d_model, c.layers,
        static_cast<long long>(std::accumulate(init.begin(), init.end(), std::int64_t{0},
                                               [](std::int64_t a, const torch::Tensor& t) { return a + t.numel(); })),
        heldout.size(), c.groups, c.group_size, c.warmup_steps, warm_s, evaluate_heldout(model, tk, heldout));

    std::vector<step_row> rows;
    std::vector<mode_summary> ms;
    if (c.mode != "async") ms.push_back(run_mode(c, tk, init, 0, "sync", heldout, rows));
    if (c.mode != "sync") ms.push_back(run_mode(c, tk, init, c.eta, "async", heldout, rows));

    const auto csv = std::filesystem::path(c.out) / "async_grpo.csv";
    write_csv(csv, rows);
    print_summary(ms, c);
    std::printf("\nCSV: %s\n", std::filesystem::absolute(csv).c_str());
    if (!c.check) {
      const auto png = std::filesystem::path(c.out) / "async_grpo.png";
      // Debian's python3-matplotlib belongs to /usr/bin/python3 (another python3 may come first on PATH).
      const std::string py = std::filesystem::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
      const std::string cmd = py + " \"" RLPT_ASYNC_GRPO_PLOT "\" \"" + csv.string() + "\" \"" + png.string() + "\"";
      if (std::system(cmd.c_str()) == 0)
        std::printf("PNG: %s\n", std::filesystem::absolute(png).c_str());
      else
        std::printf("PNG: not written (needs python3-matplotlib: scripts/deps demo)\n");
    }

    int rc = 0;
    for (const auto& m : ms) {
      for (const auto& e : m.failures) {
        std::fprintf(stderr, "FAIL [%s]: %s\n", m.name.c_str(), e.c_str());
        rc = 1;
      }
      if (c.check) {
        // Learning: the rollout reward (mean of the last three steps) rose well above its start
        // (chance: about 0.1 for the default task)
        const double first = m.reward_at(false), last = m.reward_at(true);
        if (!(last >= 0.3 && last >= 2.5 * first)) {
          std::fprintf(stderr, "FAIL [%s]: no learning: rollout reward %.3f -> %.3f, held-out accuracy %.3f -> %.3f\n",
                       m.name.c_str(), first, last, m.initial_acc, m.final_acc);
          rc = 1;
        }
      }
    }
    if (rc == 0 && c.check) std::printf("check passed: learning, staleness <= eta, sync on-policy, books balance\n");
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "async_grpo (%s): %s\n", c.role.c_str(), e.what());
    return 1;
  }
}
