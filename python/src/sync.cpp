// SPDX-License-Identifier: Apache-2.0
// rlpt._C.SyncSender / SyncReceiver: rlpt::sync::sender and receiver over the shared-memory, TCP
// or UCX transport, for torch tensors. Blocking calls (publish, poll) release the GIL. The sender
// reads CPU tensors in place (rlpt/sync.py stages device tensors into host copies first); the
// receiver keeps a host mirror of the published version (unless told not to) and hands out copies
// of its tensors, or writes CPU target tensors in place.
#include "spec.hpp"
#include "tensors.hpp"

#include <torch/extension.h>

#include <rlpt/sync/fp8.hpp>
#include <rlpt/sync/planner.hpp>
#include <rlpt/sync/preflight.hpp>
#include <rlpt/sync/protocol.hpp>
#include <rlpt/sync/shm.hpp>
#include <rlpt/sync/tcp.hpp>
#ifdef RLPT_PY_AUTH
#include <rlpt/sync/auth_openssl.hpp>
#endif
#ifdef RLPT_PY_UCX
#include <rlpt/sync/ucx.hpp>
#endif

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace py = pybind11;

namespace rlpt_py {

namespace {

using namespace rlpt::sync;

wire_dtype wire_of(at::ScalarType t) {
  switch (t) {
  case at::kFloat:
    return wire_dtype::f32;
  case at::kDouble:
    return wire_dtype::f64;
  case at::kHalf:
    return wire_dtype::f16;
  case at::kBFloat16:
    return wire_dtype::bf16;
  case at::kByte:
    return wire_dtype::u8;
  case at::kChar:
    return wire_dtype::i8;
  case at::kShort:
    return wire_dtype::i16;
  case at::kInt:
    return wire_dtype::i32;
  case at::kLong:
    return wire_dtype::i64;
  case at::kBool:
    return wire_dtype::boolean;
  case at::kFloat8_e4m3fn:
    return wire_dtype::f8_e4m3;
  case at::kFloat8_e5m2:
    return wire_dtype::f8_e5m2;
  default:
    break;
  }
  raise(ids::dtype, fmt::format("weight sync: dtype {} has no wire type", dtype_name(t)));
}

at::ScalarType torch_of(wire_dtype t) {
  switch (t) {
  case wire_dtype::f32:
    return at::kFloat;
  case wire_dtype::f64:
    return at::kDouble;
  case wire_dtype::f16:
    return at::kHalf;
  case wire_dtype::bf16:
    return at::kBFloat16;
  case wire_dtype::u8:
    return at::kByte;
  case wire_dtype::i8:
    return at::kChar;
  case wire_dtype::i16:
    return at::kShort;
  case wire_dtype::i32:
    return at::kInt;
  case wire_dtype::i64:
    return at::kLong;
  case wire_dtype::boolean:
    return at::kBool;
  case wire_dtype::f8_e4m3:
    return at::kFloat8_e4m3fn;
  case wire_dtype::f8_e5m2:
    return at::kFloat8_e5m2;
  default:
    break;
  }
  raise(ids::dtype, fmt::format("weight sync: wire type {} has no torch dtype", name(t)));
}

//! Authentication of a cross-machine (TCP) link, as the Python constructors take it.
struct link_security {
  std::string secret; //!< empty: none
  std::string integrity = "full";
  bool allow_unauthenticated = false;
};

//! A link of `transport`. `timeout` is the sender's or receiver's: a TCP link's dead-peer bound is
//! never shorter (the kernel also aborts a peer that stops reading for that long).
std::unique_ptr<rlpt::sync::link> make_link(const std::string& transport, const std::string& address, bool listen,
                                            role r, std::uint64_t slot_bytes, std::uint32_t slots,
                                            const link_security& sec, std::chrono::milliseconds timeout) {
  if (transport == "shm") {
    shm_options o;
    if (slot_bytes) o.slot_bytes = slot_bytes;
    if (slots) o.slots = slots;
    return std::make_unique<shm_transport>(address, r, o);
  }
  if (transport == "tcp" || transport == "ucx") {
    const auto colon = address.rfind(':');
    if (colon == std::string::npos)
      raise(ids::bad_option, fmt::format("{} address \"{}\" is not host:port", transport, address));
    if (sec.integrity != "full" && sec.integrity != "control")
      raise(ids::bad_option, fmt::format("integrity \"{}\" is not one of full, control", sec.integrity));
    std::shared_ptr<const authenticator> auth;
    if (!sec.secret.empty()) {
#ifdef RLPT_PY_AUTH
      auth = openssl_authenticator::from_string(sec.secret);
#else
      raise(ids::bad_option, "this rlpt package was built without OpenSSL 3 (libcrypto): secret= is unavailable; "
                             "rebuild it where OpenSSL's headers are installed (libssl-dev, openssl-devel)");
#endif
    }
    const std::string host = address.substr(0, colon);
    const auto port = static_cast<std::uint16_t>(std::stoi(address.substr(colon + 1)));
    const integrity tags = sec.integrity == "full" ? integrity::full : integrity::control;
    if (transport == "ucx") {
#ifdef RLPT_PY_UCX
      return std::make_unique<ucx_transport>(ucx_options{.host = host,
                                                         .port = port,
                                                         .listen = listen,
                                                         .auth = auth,
                                                         .tags = tags,
                                                         .allow_unauthenticated = sec.allow_unauthenticated},
                                             r);
#else
      raise(ids::bad_option, "this rlpt package was built without UCX: transport \"ucx\" is unavailable; rebuild "
                             "it where UCX (>= 1.12, with its CMake package: libucx-dev) is installed");
#endif
    }
    tcp_options o{.host = host,
                  .port = port,
                  .listen = listen,
                  .auth = auth,
                  .tags = tags,
                  .allow_unauthenticated = sec.allow_unauthenticated};
    o.dead_peer_timeout = std::clamp<std::chrono::milliseconds>(timeout, o.dead_peer_timeout, std::chrono::hours(24));
    return std::make_unique<tcp_transport>(o, r);
  }
  raise(ids::bad_option, fmt::format("weight sync transport \"{}\" is not one of shm, tcp, ucx", transport));
}

//! The bound port of a listening TCP or UCX link (0 for others).
std::uint16_t port_of(rlpt::sync::link* l) {
  if (auto* t = dynamic_cast<tcp_transport*>(l)) return t->port();
#ifdef RLPT_PY_UCX
  if (auto* t = dynamic_cast<ucx_transport*>(l)) return t->port();
#endif
  return 0;
}

py::object cache_dict(const cache_directive& c) {
  if (c.action == cache_action::none) return py::none();
  py::dict d;
  d["action"] = std::string(name(c.action));
  d["version"] = c.version;
  d["salt"] = c.salt;
  return d;
}

cache_action cache_of(const std::string& s) {
  if (s == "none") return cache_action::none;
  if (s == "reset") return cache_action::reset;
  if (s == "salt") return cache_action::salt;
  raise(ids::bad_option, fmt::format("cache \"{}\" is not one of none, reset, salt", s));
}

py::dict update_dict(const update& u) {
  py::dict d;
  d["state"] = u.published() ? "published" : u.failed() ? "failed" : "idle";
  d["version"] = u.version;
  d["base_version"] = u.base_version;
  d["delta"] = u.delta;
  d["bytes"] = u.bytes;
  d["tensors_loaded"] = u.tensors_loaded;
  d["partial"] = u.partial;
  d["error_id"] = u.error_id;
  d["reason"] = u.reason;
  d["digest"] = u.digest;
  d["seconds"] = u.seconds;
  d["cache"] = cache_dict(u.cache);
  d["cache_unacknowledged"] = u.cache_unacknowledged;
  return d;
}

//! The host transports read (sender) or write (receiver) a tensor's bytes in place: it must be a
//! contiguous CPU tensor. `what` names the role ("tensor", "target"), `why` the reason.
void expect_host_contiguous(const at::Tensor& t, const char* what, const std::string& name, const char* why) {
  if (!t.device().is_cpu())
    raise(ids::device, fmt::format("weight sync: {} \"{}\" is on {}; {}", what, name, t.device().str(), why));
  if (!t.is_contiguous()) raise(ids::strides, fmt::format("weight sync: {} \"{}\" is not contiguous", what, name));
}

class py_sender {
public:
  py_sender(const std::string& transport, const std::string& address, bool listen,
            const std::vector<std::pair<std::string, at::Tensor>>& tensors, std::uint64_t bucket_bytes,
            std::uint64_t slot_bytes, bool delta, double timeout_s, const link_security& sec)
      : tensors_() {
    guard([&] {
      std::vector<tensor_ref> refs;
      for (const auto& [name, t] : tensors) {
        expect_host_contiguous(t, "tensor", name,
                               "the sender reads host memory (rlpt.sync.Sender stages device tensors)");
        tensors_.push_back(t);
        refs.push_back({name, wire_of(t.scalar_type()), t.sizes().vec(), t.data_ptr()});
      }
      plan_options po;
      if (bucket_bytes) po.bucket_bytes = bucket_bytes;
      const manifest m = plan(refs, po);
      std::uint64_t largest = 0;
      for (std::uint64_t b = 0; b < m.bucket_count(); ++b) largest = std::max(largest, m.bucket_size(b));
      sender_options o;
      o.delta = delta;
      o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
      link_ = make_link(transport, address, listen, role::sender,
                        slot_bytes ? slot_bytes : std::max<std::uint64_t>(largest, 4096), 0, sec, o.timeout);
      sender_ = std::make_unique<sender>(*link_, m, refs, o);
      return 0;
    });
  }

  py::dict publish(std::uint64_t version) {
    publish_result r;
    {
      py::gil_scoped_release nogil;
      r = guard([&] { return sender_->publish(version); });
    }
    py::dict d;
    d["version"] = r.version;
    d["delta"] = r.delta;
    d["fell_back"] = r.fell_back;
    d["confirmed"] = r.confirmed;
    d["messages"] = r.messages;
    d["wire_bytes"] = r.wire_bytes;
    d["dense_bytes"] = r.dense_bytes;
    d["digest"] = r.digest;
    d["seconds"] = r.seconds;
    return d;
  }

  std::uint64_t published_version() const { return sender_->has_published() ? sender_->published_version() : 0; }
  std::uint16_t port() const { return port_of(link_.get()); }

private:
  std::vector<at::Tensor> tensors_;
  std::unique_ptr<rlpt::sync::link> link_;
  std::unique_ptr<sender> sender_;
};

class py_receiver {
public:
  py_receiver(const std::string& transport, const std::string& address, bool listen, double timeout_s,
              py::object on_tensor, const link_security& sec,
              const std::vector<std::pair<std::string, at::Tensor>>& targets, bool streaming, bool mirror,
              const std::string& cache)
      : on_tensor_(std::move(on_tensor)) {
    guard([&] {
      // Targets: CPU tensors the receiver writes in place (held here so they outlive it).
      std::vector<tensor_target> bound;
      for (const auto& [name, t] : targets) {
        expect_host_contiguous(t, "target", name, "the receiver writes host memory");
        targets_.push_back(t);
        bound.push_back({name, wire_of(t.scalar_type()), t.sizes().vec(), t.data_ptr()});
      }
      receiver_options o;
      o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
      link_ = make_link(transport, address, listen, role::receiver, 0, 0, sec, o.timeout);
      o.mode = streaming ? apply_mode::streaming : apply_mode::staged;
      o.mirror = mirror;
      o.cache = cache_of(cache);
      load_fn load = [this](const tensor_view& t) {
        if (on_tensor_.is_none()) return;
        py::gil_scoped_acquire gil;
        // A view of the receiver's bytes, valid during the call: the callback copies what it keeps.
        at::Tensor view =
            at::from_blob(const_cast<std::byte*>(t.bytes.data()), std::vector<int64_t>(t.shape.begin(), t.shape.end()),
                          at::TensorOptions().dtype(torch_of(t.dtype)));
        on_tensor_(std::string(t.name), view);
      };
      receiver_ = bound.empty() ? std::make_unique<receiver>(*link_, std::move(load), o)
                                : std::make_unique<receiver>(*link_, std::move(bound), std::move(load), o);
      return 0;
    });
  }

  py::dict poll(double wait_s) {
    update u;
    {
      py::gil_scoped_release nogil;
      u = guard([&] { return receiver_->poll(std::chrono::milliseconds(static_cast<int64_t>(wait_s * 1000))); });
    }
    return update_dict(u);
  }

  bool has_version() const { return receiver_->has_version(); }
  py::object pending_cache() const {
    const auto& p = receiver_->pending_cache();
    return p ? cache_dict(*p) : py::none();
  }
  void acknowledge_cache(std::uint64_t version) {
    guard([&] {
      receiver_->acknowledge_cache(version);
      return 0;
    });
  }
  std::uint64_t version() const { return receiver_->version(); }
  std::uint64_t digest() const {
    return guard([&] { return receiver_->digest(); });
  }
  std::uint64_t verify() const {
    return guard([&] { return receiver_->verify(); });
  }

  std::vector<std::string> names() const {
    return guard([&] {
      std::vector<std::string> out;
      const manifest& m = receiver_->published_manifest();
      for (std::size_t i = 0; i < m.size(); ++i) out.push_back(m[i].name);
      return out;
    });
  }

  at::Tensor tensor(const std::string& name) const {
    return guard([&] {
      const tensor_view t = receiver_->tensor(name);
      at::Tensor out =
          at::empty(std::vector<int64_t>(t.shape.begin(), t.shape.end()), at::TensorOptions().dtype(torch_of(t.dtype)));
      std::memcpy(out.data_ptr(), t.bytes.data(), t.bytes.size());
      return out;
    });
  }

  std::uint16_t port() const { return port_of(link_.get()); }

private:
  py::object on_tensor_;
  std::vector<at::Tensor> targets_;
  std::unique_ptr<rlpt::sync::link> link_;
  std::unique_ptr<receiver> receiver_;
};

//! A 2-D CPU contiguous weight for FP8 quantization (bf16, f16 or f32), as a view of its type.
template <class F> auto with_fp8_weight(const at::Tensor& w, F&& f) {
  if (!w.device().is_cpu())
    raise(ids::device, fmt::format("fp8 quantization: the weight is on {}; pass a CPU tensor", w.device().str()));
  if (w.dim() != 2) raise(ids::shape, fmt::format("fp8 quantization: the weight has {} dimensions, not 2", w.dim()));
  const at::Tensor c = w.contiguous();
  const auto rows = static_cast<rlpt::index_t>(c.size(0)), cols = static_cast<rlpt::index_t>(c.size(1));
  switch (c.scalar_type()) {
  case at::kBFloat16:
    return f(rlpt::view2d<const rlpt::bf16>(static_cast<const rlpt::bf16*>(c.data_ptr()), rows, cols));
  case at::kHalf:
    return f(rlpt::view2d<const rlpt::f16>(static_cast<const rlpt::f16*>(c.data_ptr()), rows, cols));
  case at::kFloat:
    return f(rlpt::view2d<const float>(c.data_ptr<float>(), rows, cols));
  default:
    raise(ids::dtype, fmt::format("fp8 quantization: the weight has dtype {}; rlpt quantizes bfloat16, float16 "
                                  "and float32 weights",
                                  dtype_name(c.scalar_type())));
  }
}

std::tuple<at::Tensor, at::Tensor> quantize_fp8(const at::Tensor& w, int64_t block) {
  return guard([&] {
    return with_fp8_weight(w, [&](auto wv) {
      const fp8_block b{block};
      at::Tensor q = at::empty({w.size(0), w.size(1)}, w.options().dtype(at::kFloat8_e4m3fn));
      at::Tensor s =
          at::empty({block > 0 ? fp8_scale_rows(wv.rows(), b) : 0, block > 0 ? fp8_scale_cols(wv.cols(), b) : 0},
                    w.options().dtype(at::kFloat));
      quantize_fp8_blockwise(wv,
                             rlpt::view2d<std::uint8_t>(static_cast<std::uint8_t*>(q.data_ptr()), wv.rows(), wv.cols()),
                             rlpt::view2d<float>(s.data_ptr<float>(), s.size(0), s.size(1)), b);
      return std::make_tuple(q, s);
    });
  });
}

py::dict audit_fp8(const at::Tensor& w, const at::Tensor& q, const at::Tensor& scale_inv, int64_t block) {
  const fp8_audit a = guard([&] {
    if (q.scalar_type() != at::kFloat8_e4m3fn && q.scalar_type() != at::kByte)
      raise(ids::dtype, fmt::format("fp8 audit: the codes have dtype {}; expected float8_e4m3fn or uint8",
                                    dtype_name(q.scalar_type())));
    if (scale_inv.scalar_type() != at::kFloat)
      raise(ids::dtype,
            fmt::format("fp8 audit: scale_inv has dtype {}; expected float32", dtype_name(scale_inv.scalar_type())));
    if (q.dim() != 2 || scale_inv.dim() != 2 || !q.device().is_cpu() || !scale_inv.device().is_cpu())
      raise(ids::shape, "fp8 audit: the codes and scale_inv must be 2-D CPU tensors");
    const at::Tensor qc = q.contiguous(), sc = scale_inv.contiguous();
    return with_fp8_weight(w, [&](auto wv) {
      return audit_fp8_blockwise(
          wv, rlpt::view2d<const std::uint8_t>(static_cast<const std::uint8_t*>(qc.data_ptr()), qc.size(0), qc.size(1)),
          rlpt::view2d<const float>(sc.data_ptr<float>(), sc.size(0), sc.size(1)), fp8_block{block});
    });
  });
  py::dict d;
  d["ok"] = a.ok();
  d["blocks"] = a.blocks;
  d["bad_scales"] = a.bad_scales;
  d["bad_codes"] = a.bad_codes;
  d["first"] = a.first_row >= 0 ? py::object(py::make_tuple(a.first_row, a.first_col)) : py::none();
  return d;
}

py::dict environment_dict(const environment& e) {
  py::dict d;
  d["rlpt_version"] = e.rlpt_version;
  d["protocol"] = e.protocol;
  d["host"] = e.host;
  d["machine"] = e.machine;
  d["pid"] = e.pid;
  py::dict vars;
  for (const auto& [k, v] : e.variables) vars[py::str(k)] = v ? py::object(py::str(*v)) : py::none();
  d["variables"] = vars;
  py::list devs;
  for (const auto& x : e.devices) devs.append(py::make_tuple(x.uuid, x.index));
  d["devices"] = devs;
  d["nccl"] = e.nccl;
  d["cuda_runtime"] = e.cuda_runtime;
  return d;
}

environment environment_of(const py::dict& d) {
  environment e;
  const auto get = [&](const char* k) -> py::object {
    if (!d.contains(k)) raise(ids::bad_option, fmt::format("environment: the dict has no \"{}\"", k));
    return d[k];
  };
  e.rlpt_version = get("rlpt_version").cast<std::uint32_t>();
  e.protocol = get("protocol").cast<std::uint16_t>();
  e.host = get("host").cast<std::string>();
  e.machine = get("machine").cast<std::string>();
  e.pid = get("pid").cast<std::uint64_t>();
  for (const auto& [k, v] : get("variables").cast<py::dict>())
    e.variables.emplace_back(k.cast<std::string>(),
                             v.is_none() ? std::nullopt : std::optional<std::string>(v.cast<std::string>()));
  for (const auto& x : get("devices").cast<py::list>()) {
    const auto t = x.cast<py::tuple>();
    if (t.size() != 2) raise(ids::bad_option, "environment: each device is (uuid, index)");
    e.devices.push_back({t[0].cast<std::string>(), t[1].cast<int>()});
  }
  e.nccl = get("nccl").cast<std::string>();
  e.cuda_runtime = get("cuda_runtime").cast<std::string>();
  return e;
}

preflight_rules rules_of(const std::string& r) {
  if (r == "nccl") return preflight_rules::nccl();
  if (r == "same_host") return preflight_rules::same_host();
  if (r == "version") return preflight_rules{};
  raise(ids::bad_option, fmt::format("preflight rules \"{}\" are not one of nccl, same_host, version", r));
}

} // namespace

void bind_sync(py::module_& m) {
  m.def("capture_environment", [](const std::optional<std::vector<std::string>>& variables) {
    return guard([&] {
      if (!variables) return environment_dict(capture_environment());
      const std::vector<std::string_view> names(variables->begin(), variables->end());
      return environment_dict(capture_environment(names));
    });
  });
  m.def("compare_environments", [](const py::dict& ours, const py::dict& theirs, const std::string& rules) {
    const auto found =
        guard([&] { return compare_environments(environment_of(ours), environment_of(theirs), rules_of(rules)); });
    py::list out;
    for (const auto& f : found) {
      py::dict d;
      d["field"] = f.field;
      d["ours"] = f.ours;
      d["theirs"] = f.theirs;
      d["why"] = f.why;
      out.append(d);
    }
    return out;
  });
  m.def("require_parity",
        [](const py::dict& ours, const py::dict& theirs, const std::string& rules, const std::string& peer) {
          guard([&] {
            require_parity(environment_of(ours), environment_of(theirs), rules_of(rules), peer);
            return 0;
          });
        });
  m.def("encode_environment", [](const py::dict& e) {
    const auto b = guard([&] { return encode_environment(environment_of(e)); });
    return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
  });
  m.def("decode_environment", [](const py::bytes& b) {
    const std::string s = b;
    return guard([&] {
      return environment_dict(
          decode_environment(std::span(reinterpret_cast<const std::byte*>(s.data()), s.size()), "python"));
    });
  });
  m.def("quantize_fp8_blockwise", &quantize_fp8, py::arg("weight"), py::arg("block"));
  m.def("audit_fp8_blockwise", &audit_fp8, py::arg("weight"), py::arg("q"), py::arg("scale_inv"), py::arg("block"));
  py::class_<link_security>(m, "LinkSecurity")
      .def(py::init([](py::bytes secret, std::string integrity, bool allow_unauthenticated) {
             return link_security{std::string(secret), std::move(integrity), allow_unauthenticated};
           }),
           py::arg("secret"), py::arg("integrity"), py::arg("allow_unauthenticated"));
  m.attr("SYNC_AUTH") = py::bool_(
#ifdef RLPT_PY_AUTH
      true
#else
      false
#endif
  );
  m.attr("SYNC_UCX") = py::bool_(
#ifdef RLPT_PY_UCX
      true
#else
      false
#endif
  );
  py::class_<py_sender>(m, "SyncSender")
      .def(
          py::init<const std::string&, const std::string&, bool, const std::vector<std::pair<std::string, at::Tensor>>&,
                   std::uint64_t, std::uint64_t, bool, double, const link_security&>(),
          py::arg("transport"), py::arg("address"), py::arg("listen"), py::arg("tensors"), py::arg("bucket_bytes"),
          py::arg("slot_bytes"), py::arg("delta"), py::arg("timeout_s"), py::arg("security"))
      .def("publish", &py_sender::publish, py::arg("version"))
      .def("published_version", &py_sender::published_version)
      .def("port", &py_sender::port);
  py::class_<py_receiver>(m, "SyncReceiver")
      .def(py::init<const std::string&, const std::string&, bool, double, py::object, const link_security&,
                    const std::vector<std::pair<std::string, at::Tensor>>&, bool, bool, const std::string&>(),
           py::arg("transport"), py::arg("address"), py::arg("listen"), py::arg("timeout_s"), py::arg("on_tensor"),
           py::arg("security"), py::arg("targets"), py::arg("streaming"), py::arg("mirror"), py::arg("cache"))
      .def("pending_cache", &py_receiver::pending_cache)
      .def("acknowledge_cache", &py_receiver::acknowledge_cache, py::arg("version"))
      .def("poll", &py_receiver::poll, py::arg("wait_s"))
      .def("has_version", &py_receiver::has_version)
      .def("version", &py_receiver::version)
      .def("digest", &py_receiver::digest)
      .def("verify", &py_receiver::verify)
      .def("names", &py_receiver::names)
      .def("tensor", &py_receiver::tensor, py::arg("name"))
      .def("port", &py_receiver::port);
}

} // namespace rlpt_py
