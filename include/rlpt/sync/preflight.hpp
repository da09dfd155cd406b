// SPDX-License-Identifier: Apache-2.0
//! @file
//! Preflight: what each end of a weight sync runs with, exchanged over the link and compared
//! before the first update, so that the mismatches which otherwise surface minutes later as a
//! hang or a garbled model fail at once, naming the field and both values:
//!
//!   - rlpt and wire-protocol skew between the trainer's and the engine's images;
//!   - NCCL settings every rank of a communicator must agree on: NCCL_CUMEM_ENABLE (vLLM sets
//!     it; SkyRL #143), the transports, protocol, algorithm and buffer size, whose mismatch
//!     hangs at connect or at the first collective;
//!   - both ends on one GPU, which NCCL refuses ("duplicate GPU") or deadlocks on;
//!   - a shared-memory or CUDA IPC link whose ends run on different machines.
//!
//! Both ends call preflight() on the link before the sender or receiver starts; the sender
//! speaks first. The device side adds each end's GPUs and library versions
//! (rlpt/cuda/sync/preflight.cuh).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/format.hpp>
#include <rlpt/sync/frame.hpp>
#include <rlpt/sync/link.hpp>
#include <rlpt/version.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

RLPT_NAMESPACE_BEGIN
namespace sync {

//! One GPU an end uses: its UUID ("GPU-xxxxxxxx-xxxx-...", as nvidia-smi prints it) and its
//! ordinal in that process.
struct device_identity {
  std::string uuid;
  int index = -1;
};

//! What one end runs with.
struct environment {
  std::uint32_t rlpt_version = RLPT_VERSION;
  std::uint16_t protocol = frame_protocol; //!< the update protocol's wire version
  std::string host;                        //!< host name (messages)
  std::string machine;                     //!< the kernel's boot id: equal on one machine, containers included
  std::uint64_t pid = 0;
  //! Environment variables by name; nullopt: unset.
  std::vector<std::pair<std::string, std::optional<std::string>>> variables;
  std::vector<device_identity> devices; //!< the GPUs this end moves weights with
  std::string nccl;                     //!< NCCL's version ("2.21.5"), empty where the end does not use NCCL
  std::string cuda_runtime;             //!< CUDA runtime version ("12.4"), empty on a host-only end
};

//! NCCL settings every rank of a communicator must agree on: the memory allocator (vLLM sets
//! NCCL_CUMEM_ENABLE=0 in its workers), the transports (P2P, SHM, IB, the network plugin), the
//! protocol and algorithm, the buffer size, NVLink SHARP. Interface names (NCCL_SOCKET_IFNAME)
//! may differ per machine and are not among them.
inline constexpr std::string_view nccl_parity_variables[] = {
    "NCCL_CUMEM_ENABLE", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE",  "NCCL_NET",
    "NCCL_PROTO",        "NCCL_ALGO",        "NCCL_BUFFSIZE",    "NCCL_NVLS_ENABLE",
};

//! This process's environment: version, host, boot id, pid, and `variables` read from the
//! process environment (the NCCL set by default). Devices and library versions are the device
//! side's to add.
RLPT_DEFER [[nodiscard]] environment
capture_environment(std::span<const std::string_view> variables = nccl_parity_variables);

//! What must agree between the two ends.
struct preflight_rules {
  bool same_version = true;      //!< rlpt version and wire protocol
  bool same_machine = false;     //!< shared memory, CUDA IPC: both ends on one machine
  bool distinct_devices = false; //!< NCCL: no GPU used by both ends
  bool same_nccl = false;        //!< NCCL: one library version on both ends (where both report one)
  //! Variables that must have the same value on both ends (unset equals only unset).
  std::vector<std::string> variables{};

  //! An NCCL link: versions, distinct GPUs, one NCCL version, the NCCL parity variables.
  [[nodiscard]] static preflight_rules nccl() {
    preflight_rules r{true, false, true, true, {}};
    for (const std::string_view v : nccl_parity_variables) r.variables.emplace_back(v);
    return r;
  }
  //! Shared memory or CUDA IPC: versions and one machine.
  [[nodiscard]] static preflight_rules same_host() { return {true, true, false, false, {}}; }
};

//! One disagreement: the field, each end's value as text, and what it breaks.
struct preflight_finding {
  std::string field;
  std::string ours;
  std::string theirs;
  std::string why;
};

//! Every disagreement between `ours` and `theirs` under `rules` (empty: they agree).
RLPT_DEFER [[nodiscard]] std::vector<preflight_finding>
compare_environments(const environment& ours, const environment& theirs, const preflight_rules& rules);

//! Raises rlpt.sync.preflight listing every finding of compare_environments, naming `peer`.
RLPT_DEFER void require_parity(const environment& ours, const environment& theirs, const preflight_rules& rules,
                               std::string_view peer = "the peer");

//! The wire form of an environment (little-endian, versioned, length-prefixed strings).
RLPT_DEFER [[nodiscard]] std::vector<std::byte> encode_environment(const environment& e);

//! Decodes a wire form; rlpt.sync.wire naming `where`, the field and its byte offset for
//! anything malformed, truncated, over its limits or followed by extra bytes.
RLPT_DEFER [[nodiscard]] environment decode_environment(std::span<const std::byte> bytes, std::string_view where);

//! Exchanges environments over `l` (the sender sends first, the receiver answers) and requires
//! parity under `rules`: both ends raise rlpt.sync.preflight with the same findings. Returns the
//! peer's environment. A peer that starts the update protocol instead is named as such; one that
//! sends nothing by `until` raises rlpt.sync.timeout. Needs a duplex link.
RLPT_DEFER environment preflight(link& l, role r, const environment& ours, const preflight_rules& rules,
                                 deadline until);

namespace detail {
inline constexpr std::uint16_t preflight_format = 1;
inline constexpr std::size_t preflight_max_string = 4096;
inline constexpr std::size_t preflight_max_items = 1024;
} // namespace detail

} // namespace sync
RLPT_NAMESPACE_END

#if RLPT_HEADER_IMPL()
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

RLPT_NAMESPACE_BEGIN
namespace sync {
namespace detail {

class preflight_writer {
public:
  template <class T> void put(T v) {
    const auto at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &v, sizeof(T));
  }
  //! A length-prefixed string, within the limit the decoder holds the peer to.
  void text(std::string_view field, std::string_view s) {
    RLPT_CHECK(s.size() <= preflight_max_string, errors::sync::preflight,
               "this end's preflight {} is {} bytes long, over the limit of {}", field, s.size(), preflight_max_string);
    put(static_cast<std::uint32_t>(s.size()));
    const auto at = out_.size();
    out_.resize(at + s.size());
    if (!s.empty()) std::memcpy(out_.data() + at, s.data(), s.size());
  }
  std::vector<std::byte> take() { return std::move(out_); }

private:
  std::vector<std::byte> out_;
};

class preflight_reader {
public:
  preflight_reader(std::span<const std::byte> b, std::string_view where) : b_(b), where_(where) {}

  template <class T> T get(std::string_view field) {
    RLPT_CHECK(b_.size() - at_ >= sizeof(T), errors::sync::wire,
               "{}: preflight truncated: {} needs {} bytes at byte {}, {} left", where_, field, sizeof(T), at_,
               b_.size() - at_);
    T v;
    std::memcpy(&v, b_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  std::string text(std::string_view field) {
    const auto n = get<std::uint32_t>(field);
    RLPT_CHECK(n <= preflight_max_string, errors::sync::wire,
               "{}: preflight {} at byte {} is {} bytes long, over the limit of {}", where_, field, at_ - 4, n,
               preflight_max_string);
    RLPT_CHECK(b_.size() - at_ >= n, errors::sync::wire,
               "{}: preflight truncated: {} at byte {} announces {} bytes, {} left", where_, field, at_ - 4, n,
               b_.size() - at_);
    std::string s(reinterpret_cast<const char*>(b_.data() + at_), n);
    at_ += n;
    return s;
  }
  std::uint32_t count(std::string_view field) {
    const auto n = get<std::uint32_t>(field);
    RLPT_CHECK(n <= preflight_max_items, errors::sync::wire,
               "{}: preflight announces {} {} at byte {}, over the limit of {}", where_, n, field, at_ - 4,
               preflight_max_items);
    return n;
  }
  void finish() const {
    RLPT_CHECK(at_ == b_.size(), errors::sync::wire, "{}: preflight has {} bytes after its last field (byte {})",
               where_, b_.size() - at_, at_);
  }

private:
  std::span<const std::byte> b_;
  std::string_view where_;
  std::size_t at_ = 0;
};

RLPT_DEFER inline std::string version_text(std::uint32_t v) {
  return rlpt::detail::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);
}

RLPT_DEFER inline std::string value_text(const std::optional<std::string>& v) {
  return v ? rlpt::detail::format("'{}'", *v) : std::string("unset");
}

RLPT_DEFER inline std::string devices_text(const std::vector<device_identity>& d) {
  std::string s;
  for (const auto& x : d) s += rlpt::detail::format("{}{} (device {})", s.empty() ? "" : ", ", x.uuid, x.index);
  return s.empty() ? std::string("none") : s;
}

RLPT_DEFER inline const std::optional<std::string>* find_variable(const environment& e, std::string_view name) {
  for (const auto& [k, v] : e.variables)
    if (k == name) return &v;
  return nullptr;
}

} // namespace detail

RLPT_DEFER RLPT_INLINE environment capture_environment(std::span<const std::string_view> variables) {
  environment e;
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) == 0) e.host = host;
  if (const int fd = ::open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC); fd >= 0) {
    char id[64] = {};
    const auto n = ::read(fd, id, sizeof(id) - 1);
    ::close(fd);
    if (n > 0) e.machine.assign(id, static_cast<std::size_t>(n));
    while (!e.machine.empty() && (e.machine.back() == '\n' || e.machine.back() == ' ')) e.machine.pop_back();
  }
  e.pid = static_cast<std::uint64_t>(::getpid());
  for (const std::string_view name : variables) {
    const std::string key(name);
    const char* v = std::getenv(key.c_str());
    e.variables.emplace_back(key, v != nullptr ? std::optional<std::string>(v) : std::nullopt);
  }
  return e;
}

RLPT_DEFER RLPT_INLINE std::vector<preflight_finding>
compare_environments(const environment& ours, const environment& theirs, const preflight_rules& rules) {
  std::vector<preflight_finding> out;
  if (rules.same_version) {
    if (ours.rlpt_version != theirs.rlpt_version)
      out.push_back({"rlpt version", detail::version_text(ours.rlpt_version), detail::version_text(theirs.rlpt_version),
                     "both ends must run one rlpt version (the wire formats and defaults are a version's)"});
    if (ours.protocol != theirs.protocol)
      out.push_back({"wire protocol", rlpt::detail::format("{}", ours.protocol),
                     rlpt::detail::format("{}", theirs.protocol), "the update frames differ"});
  }
  if (rules.same_machine) {
    const bool by_boot = !ours.machine.empty() && !theirs.machine.empty();
    if (by_boot ? ours.machine != theirs.machine : ours.host != theirs.host)
      out.push_back({"machine", rlpt::detail::format("{} (boot id {})", ours.host, ours.machine),
                     rlpt::detail::format("{} (boot id {})", theirs.host, theirs.machine),
                     "shared memory and CUDA IPC need both ends on one machine"});
  }
  if (rules.distinct_devices) {
    for (const auto& a : ours.devices)
      for (const auto& b : theirs.devices)
        if (!a.uuid.empty() && a.uuid == b.uuid)
          out.push_back({"device", rlpt::detail::format("{} (device {})", a.uuid, a.index),
                         rlpt::detail::format("{} (device {})", b.uuid, b.index),
                         "both ends use this GPU: NCCL refuses two ranks of one communicator on one device "
                         "(\"Duplicate GPU detected\"); give the engine and the trainer different GPUs"});
  }
  if (rules.same_nccl && !ours.nccl.empty() && !theirs.nccl.empty() && ours.nccl != theirs.nccl)
    out.push_back({"NCCL version", ours.nccl, theirs.nccl, "NCCL needs one library version across a communicator"});
  for (const std::string& name : rules.variables) {
    const auto* a = detail::find_variable(ours, name);
    const auto* b = detail::find_variable(theirs, name);
    const std::optional<std::string> none;
    const auto& va = a != nullptr ? *a : none;
    const auto& vb = b != nullptr ? *b : none;
    if (va != vb)
      out.push_back({name, detail::value_text(va), detail::value_text(vb),
                     "every rank of an NCCL communicator must run with the same value (a mismatch hangs at "
                     "connect or at the first transfer)"});
  }
  return out;
}

RLPT_DEFER RLPT_INLINE void require_parity(const environment& ours, const environment& theirs,
                                           const preflight_rules& rules, std::string_view peer) {
  const auto found = compare_environments(ours, theirs, rules);
  if (found.empty()) return;
  std::string text;
  for (const auto& f : found)
    text += rlpt::detail::format("\n  {}: {} here, {} on {}: {}", f.field, f.ours, f.theirs, peer, f.why);
  RLPT_FAIL(errors::sync::preflight, "preflight against {} ({} on {}, pid {}) found {} mismatch{}:{}", peer,
            theirs.host.empty() ? std::string("?") : theirs.host, detail::devices_text(theirs.devices), theirs.pid,
            found.size(), found.size() == 1 ? "" : "es", text);
}

RLPT_DEFER RLPT_INLINE std::vector<std::byte> encode_environment(const environment& e) {
  RLPT_CHECK(e.variables.size() <= detail::preflight_max_items && e.devices.size() <= detail::preflight_max_items,
             errors::sync::preflight, "an environment holds at most {} variables and {} devices, got {} and {}",
             detail::preflight_max_items, detail::preflight_max_items, e.variables.size(), e.devices.size());
  detail::preflight_writer w;
  w.put(preflight_magic);
  w.put(detail::preflight_format);
  w.put(e.rlpt_version);
  w.put(e.protocol);
  w.text("host", e.host);
  w.text("machine", e.machine);
  w.put(e.pid);
  w.put(static_cast<std::uint32_t>(e.variables.size()));
  for (const auto& [name, value] : e.variables) {
    w.text("variable name", name);
    w.put(static_cast<std::uint8_t>(value ? 1 : 0));
    if (value) w.text(name, *value);
  }
  w.put(static_cast<std::uint32_t>(e.devices.size()));
  for (const auto& d : e.devices) {
    w.text("device uuid", d.uuid);
    w.put(static_cast<std::int32_t>(d.index));
  }
  w.text("nccl", e.nccl);
  w.text("cuda_runtime", e.cuda_runtime);
  return w.take();
}

RLPT_DEFER RLPT_INLINE environment decode_environment(std::span<const std::byte> bytes, std::string_view where) {
  detail::preflight_reader r(bytes, where);
  const auto magic = r.get<std::uint32_t>("magic");
  RLPT_CHECK(magic != frame_magic, errors::sync::wire,
             "{}: the peer sent an update-protocol frame, not its preflight: both ends must call sync::preflight "
             "before the sender or receiver starts",
             where);
  RLPT_CHECK(magic == preflight_magic, errors::sync::wire, "{}: not a preflight (magic 0x{:08x}, expected 0x{:08x})",
             where, magic, preflight_magic);
  const auto format = r.get<std::uint16_t>("format");
  RLPT_CHECK(format == detail::preflight_format, errors::sync::wire,
             "{}: preflight format {} (this rlpt reads format {}): the ends run different rlpt versions", where, format,
             detail::preflight_format);
  environment e;
  e.rlpt_version = r.get<std::uint32_t>("rlpt_version");
  e.protocol = r.get<std::uint16_t>("protocol");
  e.host = r.text("host");
  e.machine = r.text("machine");
  e.pid = r.get<std::uint64_t>("pid");
  const auto nv = r.count("variables");
  for (std::uint32_t i = 0; i < nv; ++i) {
    std::string name = r.text("variable name");
    const auto set = r.get<std::uint8_t>("variable flag");
    RLPT_CHECK(set <= 1, errors::sync::wire, "{}: preflight variable {} has flag {} (0 unset, 1 set)", where, name,
               set);
    std::optional<std::string> value;
    if (set == 1) value = r.text("variable value");
    e.variables.emplace_back(std::move(name), std::move(value));
  }
  const auto nd = r.count("devices");
  for (std::uint32_t i = 0; i < nd; ++i) {
    device_identity d;
    d.uuid = r.text("device uuid");
    d.index = r.get<std::int32_t>("device index");
    e.devices.push_back(std::move(d));
  }
  e.nccl = r.text("nccl");
  e.cuda_runtime = r.text("cuda_runtime");
  r.finish();
  return e;
}

RLPT_DEFER RLPT_INLINE environment preflight(link& l, role r, const environment& ours, const preflight_rules& rules,
                                             deadline until) {
  const link_info info = l.info();
  RLPT_CHECK(info.duplex, errors::sync::bad_link,
             "{}: preflight needs a duplex link (this one never answers: a file or a one-way transport)", info.name);
  const auto mine = encode_environment(ours);
  const auto receive_peer = [&] {
    const auto m = l.receive(until);
    RLPT_CHECK(m.has_value(), errors::sync::timeout,
               "{}: no preflight from the {} by the deadline (did it call sync::preflight?)", info.name,
               r == role::sender ? "receiver" : "sender");
    environment e = decode_environment(m->meta, info.name);
    l.release();
    return e;
  };
  environment theirs;
  if (r == role::sender) {
    l.send(mine, 0, until);
    theirs = receive_peer();
  } else {
    theirs = receive_peer();
    l.send(mine, 0, until);
  }
  require_parity(ours, theirs, rules, r == role::sender ? "the receiver" : "the sender");
  return theirs;
}

} // namespace sync
RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
