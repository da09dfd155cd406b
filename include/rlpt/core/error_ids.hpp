// SPDX-License-Identifier: Apache-2.0
//! @file
//! Every error id rlpt raises, as a named constant: `rlpt::errors::<block>::<problem>` holds
//! "rlpt.<block>.<problem>", the string `rlpt::error::id()` returns. Compare against these
//! instead of spelling ids by hand:
//!
//!     catch (const rlpt::error& e) { if (e.id() == rlpt::errors::layout::bad_offsets) ... }
//!
//! Ids are stable across versions. docs/errors.md lists them (generated from this file by
//! scripts/gen-error-docs); a test checks that each one is raised somewhere and documented.
#pragma once

#include <rlpt/config.hpp>

#include <string_view>

RLPT_NAMESPACE_BEGIN

//! A stable error id such as "rlpt.layout.bad_offsets". Only the constants below exist: rlpt's
//! own checks take an `error_id`, so an id cannot be misspelled in code.
class error_id {
public:
  explicit constexpr error_id(const char* id) noexcept : id_(id) {}
  [[nodiscard]] constexpr std::string_view str() const noexcept { return id_; }
  constexpr operator std::string_view() const noexcept { return id_; } // NOLINT(google-explicit-constructor)
  friend constexpr bool operator==(error_id a, std::string_view b) noexcept { return a.str() == b; }

private:
  const char* id_;
};

namespace errors {

//! `rlpt.advantage.*`
namespace advantage {
//! group offsets or ids do not describe the batch
inline constexpr error_id bad_groups{"rlpt.advantage.bad_groups"};
//! a sequence length is negative or exceeds its row
inline constexpr error_id bad_length{"rlpt.advantage.bad_length"};
//! an estimator option is out of its range (gamma, lambda, epsilon, k, ...)
inline constexpr error_id bad_option{"rlpt.advantage.bad_option"};
//! inputs disagree in shape, or a multi-reward input has no channel
inline constexpr error_id bad_shape{"rlpt.advantage.bad_shape"};
//! a device estimator was asked to raise from a kernel; it can only mask and count
inline constexpr error_id device_policy{"rlpt.advantage.device_policy"};
//! a group has fewer samples than the estimator needs (RLOO, leave-one-out baselines)
inline constexpr error_id group_size{"rlpt.advantage.group_size"};
//! a reward, value or advantage is NaN or infinite under on_nonfinite = raise
inline constexpr error_id nonfinite{"rlpt.advantage.nonfinite"};
//! masked whitening has too few valid values for its variance
inline constexpr error_id whiten_too_few{"rlpt.advantage.whiten_too_few"};
} // namespace advantage

//! `rlpt.cuda.*`
namespace cuda {
//! a cuBLAS call failed
inline constexpr error_id cublas{"rlpt.cuda.cublas"};
//! a CUDA runtime or driver call failed
inline constexpr error_id error{"rlpt.cuda.error"};
//! the caller workspace is smaller than the size query asked for
inline constexpr error_id workspace_too_small{"rlpt.cuda.workspace_too_small"};
} // namespace cuda

//! `rlpt.dlpack.*`
namespace dlpack {
//! a DLPack tensor is not aligned to its element size
inline constexpr error_id alignment{"rlpt.dlpack.alignment"};
//! a DLPack tensor lives in another memory space than the view asked for
inline constexpr error_id device{"rlpt.dlpack.device"};
//! a DLPack tensor has another dtype than the view asked for
inline constexpr error_id dtype{"rlpt.dlpack.dtype"};
//! a DLPack tensor has another number of dimensions than the view asked for
inline constexpr error_id ndim{"rlpt.dlpack.ndim"};
//! a non-empty DLPack tensor has a null data pointer
inline constexpr error_id null{"rlpt.dlpack.null"};
//! a DLPack tensor has a negative or overflowing extent
inline constexpr error_id shape{"rlpt.dlpack.shape"};
//! a DLPack tensor is not laid out as the view needs (contiguous rows)
inline constexpr error_id strides{"rlpt.dlpack.strides"};
} // namespace dlpack

//! `rlpt.dtype.*`
namespace dtype {
//! a tensor has a dtype the function does not take
inline constexpr error_id unsupported{"rlpt.dtype.unsupported"};
} // namespace dtype

//! `rlpt.executor.*`
namespace executor {
//! a thread pool was asked for fewer than one thread
inline constexpr error_id bad_threads{"rlpt.executor.bad_threads"};
} // namespace executor

//! `rlpt.groups.*`
namespace groups {
//! group offsets do not start at 0, do not increase, or describe more sequences than groups hold
inline constexpr error_id bad_offsets{"rlpt.groups.bad_offsets"};
//! sequences cannot be split into groups of the given size, or are more than groups describe
inline constexpr error_id bad_size{"rlpt.groups.bad_size"};
} // namespace groups

//! `rlpt.layout.*`
namespace layout {
//! packed offsets (cu_seqlens) are empty, do not start at 0, or decrease
inline constexpr error_id bad_offsets{"rlpt.layout.bad_offsets"};
//! a padded layout has a negative or overflowing extent
inline constexpr error_id bad_shape{"rlpt.layout.bad_shape"};
//! a padded layout row stride is negative (other than -1) or smaller than its row length
inline constexpr error_id bad_stride{"rlpt.layout.bad_stride"};
} // namespace layout

//! `rlpt.logprob.*`
namespace logprob {
//! an output overlaps an input in a way the kernel cannot handle
inline constexpr error_id alias{"rlpt.logprob.alias"};
//! a vocabulary shard does not fit the global vocabulary
inline constexpr error_id bad_shard{"rlpt.logprob.bad_shard"};
//! an option of a logprob statistic is out of its range (the mismatch band or clamp)
inline constexpr error_id bad_option{"rlpt.logprob.bad_option"};
//! lm-head token or vocabulary tile is not positive
inline constexpr error_id bad_tile{"rlpt.logprob.bad_tile"};
//! a target has probability 0 under top-k/top-p scoring
inline constexpr error_id dropped_target{"rlpt.logprob.dropped_target"};
//! min_p is outside [0, 1], or min_p_order is not one of its values
inline constexpr error_id min_p{"rlpt.logprob.min_p"};
//! the backward was not given the statistics the forward saved
inline constexpr error_id missing_saved{"rlpt.logprob.missing_saved"};
//! a logits row has no usable softmax (NaN, +inf, or every entry -inf), or a log-prob given to
//! the mismatch metrics is not finite (or above 700) at a valid token
inline constexpr error_id nonfinite{"rlpt.logprob.nonfinite"};
//! logits, targets and outputs disagree in shape
inline constexpr error_id shape_mismatch{"rlpt.logprob.shape_mismatch"};
//! a target is outside the vocabulary and is not ignore_index
inline constexpr error_id target_out_of_range{"rlpt.logprob.target_out_of_range"};
//! temperature is not finite and > 0
inline constexpr error_id temperature{"rlpt.logprob.temperature"};
//! top_k is negative (other than -1 = off)
inline constexpr error_id top_k{"rlpt.logprob.top_k"};
//! top_p is outside (0, 1]
inline constexpr error_id top_p{"rlpt.logprob.top_p"};
//! an option combination the called kernel does not implement
inline constexpr error_id unsupported{"rlpt.logprob.unsupported"};
} // namespace logprob

//! `rlpt.nccl.*`
namespace nccl {
//! an NCCL call failed
inline constexpr error_id error{"rlpt.nccl.error"};
} // namespace nccl

//! `rlpt.objective.*`
namespace objective {
//! an aggregation denominator (global_tokens, seqs) is not finite and >= 0
inline constexpr error_id bad_denominator{"rlpt.objective.bad_denominator"};
//! the layout does not fit the device grid or the objective
inline constexpr error_id bad_layout{"rlpt.objective.bad_layout"};
//! an objective option is out of its range
inline constexpr error_id bad_option{"rlpt.objective.bad_option"};
//! a framework preset was given a setting rlpt does not reproduce
inline constexpr error_id compat{"rlpt.objective.compat"};
//! two inputs that exclude each other were both given
inline constexpr error_id conflicting_input{"rlpt.objective.conflicting_input"};
//! an input the objective needs was not given
inline constexpr error_id missing_input{"rlpt.objective.missing_input"};
//! an input or result is NaN or infinite under nonfinite = raise
inline constexpr error_id nonfinite{"rlpt.objective.nonfinite"};
} // namespace objective

//! `rlpt.rollout.*`
namespace rollout {
//! a balancing cost is negative or not finite
inline constexpr error_id bad_cost{"rlpt.rollout.bad_cost"};
//! an extra column has an unknown dtype or a bad width
inline constexpr error_id bad_extra{"rlpt.rollout.bad_extra"};
//! a group declaration or record is inconsistent (size, id)
inline constexpr error_id bad_group{"rlpt.rollout.bad_group"};
//! group sizes do not add up to the batch
inline constexpr error_id bad_groups{"rlpt.rollout.bad_groups"};
//! an item index, offset or length is outside the batch or not monotonic
inline constexpr error_id bad_items{"rlpt.rollout.bad_items"};
//! a sequence length is negative or too large
inline constexpr error_id bad_length{"rlpt.rollout.bad_length"};
//! a buffer, packing or balancing option is out of its range
inline constexpr error_id bad_option{"rlpt.rollout.bad_option"};
//! a partition count is below 1 or larger than the input allows
inline constexpr error_id bad_partition{"rlpt.rollout.bad_partition"};
//! a pop asks for more groups than the buffer can hold
inline constexpr error_id bad_pop{"rlpt.rollout.bad_pop"};
//! a selected column or channel does not exist
inline constexpr error_id bad_selection{"rlpt.rollout.bad_selection"};
//! a checkpoint file is damaged or truncated
inline constexpr error_id checkpoint_corrupt{"rlpt.rollout.checkpoint_corrupt"};
//! reading or writing a checkpoint file failed
inline constexpr error_id checkpoint_io{"rlpt.rollout.checkpoint_io"};
//! a checkpoint has a format version this rlpt does not read
inline constexpr error_id checkpoint_version{"rlpt.rollout.checkpoint_version"};
//! an extra column holds another dtype than asked for
inline constexpr error_id extra_dtype{"rlpt.rollout.extra_dtype"};
//! a record arrived for a group that already completed
inline constexpr error_id group_complete{"rlpt.rollout.group_complete"};
//! the batch has no extra column of that name
inline constexpr error_id no_extra{"rlpt.rollout.no_extra"};
//! a multi-turn continuation does not extend the tokens held
inline constexpr error_id prefix_mismatch{"rlpt.rollout.prefix_mismatch"};
//! a trajectory field has the wrong number of elements
inline constexpr error_id record_size{"rlpt.rollout.record_size"};
//! a trajectory field holds an invalid value
inline constexpr error_id record_value{"rlpt.rollout.record_value"};
//! a restored buffer state contradicts itself (counters, ids)
inline constexpr error_id restore_inconsistent{"rlpt.rollout.restore_inconsistent"};
//! a restored buffer state was saved with another configuration or schema
inline constexpr error_id restore_mismatch{"rlpt.rollout.restore_mismatch"};
//! restore was called on a buffer that already holds records
inline constexpr error_id restore_nonempty{"rlpt.rollout.restore_nonempty"};
//! more items than balancing can index
inline constexpr error_id too_many_items{"rlpt.rollout.too_many_items"};
} // namespace rollout

//! `rlpt.staleness.*`
namespace staleness {
//! a group was completed twice or given the wrong records
inline constexpr error_id bad_group{"rlpt.staleness.bad_group"};
//! a staleness histogram entry is negative
inline constexpr error_id bad_histogram{"rlpt.staleness.bad_histogram"};
//! a gate, buffer or selection option is out of its range
inline constexpr error_id bad_option{"rlpt.staleness.bad_option"};
//! a ticket or group was moved to a state it cannot reach from its current one
inline constexpr error_id bad_transition{"rlpt.staleness.bad_transition"};
//! a policy version is negative or out of order
inline constexpr error_id bad_version{"rlpt.staleness.bad_version"};
//! batch or concurrency limits do not divide by the data-parallel size
inline constexpr error_id dp_indivisible{"rlpt.staleness.dp_indivisible"};
//! an item carries a policy version newer than the current one
inline constexpr error_id future_version{"rlpt.staleness.future_version"};
//! target_version selection met an item without a target version
inline constexpr error_id no_target{"rlpt.staleness.no_target"};
//! a partial rollout chunk carries a NaN or infinite logprob
inline constexpr error_id non_finite{"rlpt.staleness.non_finite"};
//! a partial rollout chunk exceeds the remaining token budget
inline constexpr error_id partial_budget{"rlpt.staleness.partial_budget"};
//! a partial rollout was continued after it finished
inline constexpr error_id partial_state{"rlpt.staleness.partial_state"};
//! restore was called while tickets are outstanding
inline constexpr error_id restore_busy{"rlpt.staleness.restore_busy"};
//! a restored staleness state disagrees with the clock
inline constexpr error_id restore_mismatch{"rlpt.staleness.restore_mismatch"};
//! a saved staleness state is damaged or truncated
inline constexpr error_id state_corrupt{"rlpt.staleness.state_corrupt"};
//! a ticket is used for another group than it carries
inline constexpr error_id ticket_mismatch{"rlpt.staleness.ticket_mismatch"};
//! a ticket is empty or not known to the gate
inline constexpr error_id unknown_ticket{"rlpt.staleness.unknown_ticket"};
//! a trained token has no policy version
inline constexpr error_id untagged_token{"rlpt.staleness.untagged_token"};
//! the policy version would overflow int32
inline constexpr error_id version_overflow{"rlpt.staleness.version_overflow"};
} // namespace staleness

//! `rlpt.sync.*`
namespace sync {
//! an update was aborted; the receiver stays on its previous version
inline constexpr error_id aborted{"rlpt.sync.aborted"};
//! a peer failed authentication or a frame failed its tag; the receiver stays on its version
inline constexpr error_id auth{"rlpt.sync.auth"};
//! a delta record is malformed or does not fit its tensor
inline constexpr error_id bad_delta{"rlpt.sync.bad_delta"};
//! a transport was misused or misconfigured
inline constexpr error_id bad_link{"rlpt.sync.bad_link"};
//! a manifest is malformed or inconsistent
inline constexpr error_id bad_manifest{"rlpt.sync.bad_manifest"};
//! bucket planning options are invalid
inline constexpr error_id bad_plan{"rlpt.sync.bad_plan"};
//! a safetensors file or header is malformed
inline constexpr error_id bad_safetensors{"rlpt.sync.bad_safetensors"};
//! a tensor shape is invalid or over the limits
inline constexpr error_id bad_shape{"rlpt.sync.bad_shape"};
//! sender sources do not match the manifest
inline constexpr error_id bad_source{"rlpt.sync.bad_source"};
//! a receiver transform is invalid
inline constexpr error_id bad_transform{"rlpt.sync.bad_transform"};
//! a version number is out of order
inline constexpr error_id bad_version{"rlpt.sync.bad_version"};
//! a delta's base is not the receiver's published version
inline constexpr error_id base_mismatch{"rlpt.sync.base_mismatch"};
//! a piece arrived with a checksum other than the sender's
inline constexpr error_id checksum{"rlpt.sync.checksum"};
//! a file operation failed
inline constexpr error_id io{"rlpt.sync.io"};
//! a cross-machine link has no authenticator and did not opt out
inline constexpr error_id insecure{"rlpt.sync.insecure"};
//! a CUDA IPC handle could not be exported or opened
inline constexpr error_id ipc{"rlpt.sync.ipc"};
//! a JSON text is invalid
inline constexpr error_id json{"rlpt.sync.json"};
//! the receiver's load callback threw
inline constexpr error_id load_failed{"rlpt.sync.load_failed"};
//! a manifest does not hash to its layout hash
inline constexpr error_id manifest_hash{"rlpt.sync.manifest_hash"};
//! a receiver was asked for an update that is not there
inline constexpr error_id no_update{"rlpt.sync.no_update"};
//! no version has been published yet
inline constexpr error_id no_version{"rlpt.sync.no_version"};
//! a weight to quantize holds a NaN or an infinity
inline constexpr error_id nonfinite{"rlpt.sync.nonfinite"};
//! the peer closed or crashed
inline constexpr error_id peer_lost{"rlpt.sync.peer_lost"};
//! the two ends of a link disagree on what must match (versions, machine, GPUs, NCCL settings)
inline constexpr error_id preflight{"rlpt.sync.preflight"};
//! a frame arrived out of protocol order
inline constexpr error_id protocol{"rlpt.sync.protocol"};
//! receiving an update failed; the receiver stays on its previous version
inline constexpr error_id receive_failed{"rlpt.sync.receive_failed"};
//! the peer reported an error without an id
inline constexpr error_id remote{"rlpt.sync.remote"};
//! a shared-memory operation failed
inline constexpr error_id shm{"rlpt.sync.shm"};
//! a version was not newer than the receiver's
inline constexpr error_id stale_version{"rlpt.sync.stale_version"};
//! an update was superseded by a newer BEGIN before it completed
inline constexpr error_id superseded{"rlpt.sync.superseded"};
//! a socket operation failed
inline constexpr error_id tcp{"rlpt.sync.tcp"};
//! a blocking step ran past its deadline
inline constexpr error_id timeout{"rlpt.sync.timeout"};
//! a size exceeds what the transport or format can hold
inline constexpr error_id too_large{"rlpt.sync.too_large"};
//! a streaming update partly overwrote the mirror and failed
inline constexpr error_id torn{"rlpt.sync.torn"};
//! a bucket or frame is shorter than announced
inline constexpr error_id truncated{"rlpt.sync.truncated"};
//! a UCX call failed (context, worker, listener or endpoint)
inline constexpr error_id ucx{"rlpt.sync.ucx"};
//! a tensor name is not in the manifest
inline constexpr error_id unknown_tensor{"rlpt.sync.unknown_tensor"};
//! a wire frame is malformed
inline constexpr error_id wire{"rlpt.sync.wire"};
} // namespace sync

//! `rlpt.view.*`
namespace view {
//! a view has a negative extent, or more elements than index_t counts
inline constexpr error_id bad_shape{"rlpt.view.bad_shape"};
//! a 2-D view row stride is smaller than its columns
inline constexpr error_id bad_stride{"rlpt.view.bad_stride"};
//! an object given as a view has non-contiguous elements (a strided Eigen Map, padded rows in a 1-D view)
inline constexpr error_id not_contiguous{"rlpt.view.not_contiguous"};
//! a subview falls outside its view
inline constexpr error_id out_of_range{"rlpt.view.out_of_range"};
//! a view has another number of elements than the call needs
inline constexpr error_id size_mismatch{"rlpt.view.size_mismatch"};
} // namespace view

} // namespace errors
RLPT_NAMESPACE_END
