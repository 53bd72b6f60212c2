// Thin, torch-free layer over the CUDA runtime and (run-time resolved) driver API.
//
// Everything here is host code: every primitive is a single CUDA API call or a short
// loop of them, issued on a stream that the caller passes as an integer. This header is
// deliberately free of torch and CUDA headers, so that the torch-facing translation unit
// (ops.cpp, compiled by the host compiler as C++20) and the CUDA translation unit
// (cuda_api.cu, compiled by nvcc) share nothing but plain integers and std types.
//
// Every function either succeeds or throws std::runtime_error whose message names the
// failing CUDA call and its error name/string. Argument validation is NOT done here: the
// caller (ops.cpp) validates everything before calling in, so that validation never
// touches a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace tf_kernel {
namespace cuda_api {

// One cudaMemcpy2DAsync(dst + b*dst_batch_stride, dst_pitch, src + b*src_batch_stride,
// src_pitch, width, height, cudaMemcpyDefault, stream) per b in [0, batch), with the
// current device switched to `device` for the duration of the call.
void copy_2d(int device, std::uint64_t dst, std::uint64_t dst_pitch, std::uint64_t dst_batch_stride,
             std::uint64_t src, std::uint64_t src_pitch, std::uint64_t src_batch_stride,
             std::uint64_t width, std::uint64_t height, std::uint64_t batch, std::uint64_t stream);

// cuStreamWriteValue{32,64}(stream, address, value, CU_STREAM_WRITE_VALUE_DEFAULT).
void stream_write_value(std::uint64_t address, std::uint64_t value, std::uint64_t stream, int bits);

// cuStreamWaitValue{32,64}(stream, address, value, CU_STREAM_WAIT_VALUE_GEQ).
void stream_wait_value_geq(std::uint64_t address, std::uint64_t value, std::uint64_t stream, int bits);

// Writes `value` to every write_addresses[i], then waits (GEQ) on every wait_addresses[i],
// all on `stream`. `peers[i]` is only used to name the peer in error messages.
void stream_handshake(const std::uint64_t* write_addresses, const std::uint64_t* wait_addresses,
                      const std::int64_t* peers, std::size_t count, std::uint64_t value,
                      std::uint64_t stream, int bits);

// cuMemGetAddressRange for `address` -> (allocation base, allocation size), with the
// owning device made current.
std::pair<std::uint64_t, std::uint64_t> address_range(std::uint64_t address);

// cudaIpcGetMemHandle of the allocation that contains `address` (on `device`).
// Writes the 64 handle bytes to handle_out and returns address - allocation base.
std::uint64_t ipc_get_handle(int device, std::uint64_t address, unsigned char* handle_out);

// cudaIpcOpenMemHandle(handle, cudaIpcMemLazyEnablePeerAccess) on the current device;
// checks that offset lies inside the mapping and returns base + offset.
std::uint64_t ipc_open_handle(const unsigned char* handle, std::uint64_t offset);

// Resolves the mapping base of `address` and cudaIpcCloseMemHandle(base).
void ipc_close_handle(std::uint64_t address);

// cudaDriverGetVersion (0 when no driver is installed) and cudaRuntimeGetVersion.
int driver_version();
int runtime_version();

// CUDART_VERSION of the headers this file was compiled against.
int compiled_runtime_version();

// Size in bytes of cudaIpcMemHandle_t (64); checked with a static_assert in cuda_api.cu.
constexpr std::size_t kIpcHandleBytes = 64;

}  // namespace cuda_api
}  // namespace tf_kernel
