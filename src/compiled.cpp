// SPDX-License-Identifier: Apache-2.0
// rlpt::compiled: the one translation unit that defines, out of line, the functions every header
// declares under RLPT_COMPILED_LIB (include/rlpt/config.hpp, "separate compilation"). The target
// defines RLPT_COMPILED_LIB publicly and RLPT_COMPILED_LIB_SOURCE here, so this TU sees each
// header's definitions section and compiles it once, with no `inline`.
#include <rlpt/rlpt.hpp>

#if !defined(RLPT_COMPILED_LIB) || !RLPT_HEADER_IMPL()
#error "src/compiled.cpp is built by the rlpt_compiled target, with RLPT_COMPILED_LIB and RLPT_COMPILED_LIB_SOURCE"
#endif

// The classes among those definitions are class templates of one unused parameter (config.hpp,
// RLPT_DEFER): their one specialisation, declared `extern template` in every other TU.
template class rlpt::basic_partial_rollout<>;
template class rlpt::basic_rollout_batch<>;
template class rlpt::basic_rollout_buffer<>;
template class rlpt::basic_staleness_buffer<>;
template class rlpt::basic_staleness_gate<>;
template class rlpt::basic_starvation_monitor<>;
template class rlpt::basic_trajectory_builder<>;
template class rlpt::sync::basic_delta_encoder<>;
template class rlpt::sync::basic_forwarder<>;
template class rlpt::sync::basic_host_receiver<>;
template class rlpt::sync::basic_host_sender<>;
template class rlpt::sync::basic_inproc_transport<>;
template class rlpt::sync::basic_manifest<>;
template class rlpt::sync::basic_safetensors_file<>;
template class rlpt::sync::basic_safetensors_transport<>;
template class rlpt::sync::basic_shm_transport<>;
template class rlpt::sync::basic_tcp_transport<>;
template class rlpt::sync::basic_transform_plan<>;
template class rlpt::sync::detail::basic_cut_through<>;
template class rlpt::sync::detail::basic_host_receive_backend<>;
template class rlpt::sync::detail::basic_host_send_backend<>;
template class rlpt::sync::detail::basic_json_parser<>;
template class rlpt::sync::detail::basic_peer_auth<>;
