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

// One pitched copy of copy_2d_batch, in bytes (source and destination are device addresses).
struct PitchedCopyArgs {
  std::uint64_t dst, dst_pitch, dst_batch_stride;
  std::uint64_t src, src_pitch, src_batch_stride;
  std::uint64_t width, height, batch;
};

// Optionally (wait_event != 0) records wait_event on wait_stream and makes `stream` wait on it; then submits every
// copy on `stream`: one cudaMemcpy3DBatchAsync for all of them where the runtime has it (CUDA 12.8+; a copy whose
// batch strides are whole multiples of its pitches is one 3-D operation, others one operation per batch item),
// else one cudaMemcpy2DAsync per copy and batch item; under CUDA graph capture (the runtime refuses the batched
// call there) always one cudaMemcpy2DAsync per copy and batch item. The current device is `device` for the duration.
void copy_2d_batch(int device, const PitchedCopyArgs* copies, std::size_t count, std::uint64_t stream,
                   std::uint64_t wait_stream, std::uint64_t wait_event);

// Whether copy_2d_batch submitted its last batch with one cudaMemcpy3DBatchAsync (1), fell back to a loop of
// cudaMemcpy2DAsync because the runtime refused the batched call (0), or has not run yet (-1).
int copy_batch_mode();

// Whether stream_handshake submitted its last handshake with one cuStreamBatchMemOp (1), per operation (0), or
// has not run yet (-1).
int memop_batch_mode();

// cudaEventCreateWithFlags(cudaEventDisableTiming) on `device`; cudaEventDestroy.
std::uint64_t event_create(int device);
void event_destroy(std::uint64_t event);

// (32-bit stream memory operations usable, 64-bit ones usable) on `device`: the _v2 entry points resolve, and for
// 64 bits CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS is set.
std::pair<int, int> stream_memop_support(int device);

// cuStreamWriteValue{32,64}(stream, address, value, CU_STREAM_WRITE_VALUE_DEFAULT).
void stream_write_value(std::uint64_t address, std::uint64_t value, std::uint64_t stream, int bits);

// cuStreamWaitValue{32,64}(stream, address, value, CU_STREAM_WAIT_VALUE_GEQ).
void stream_wait_value_geq(std::uint64_t address, std::uint64_t value, std::uint64_t stream, int bits);

// Writes `value` to every write_addresses[i], then waits (GEQ) on every wait_addresses[i],
// all on `stream`: one cuStreamBatchMemOp where the driver takes it, else one memop call each.
// `peers[i]` is only used to name the peer in error messages.
void stream_handshake(const std::uint64_t* write_addresses, const std::uint64_t* wait_addresses,
                      const std::int64_t* peers, std::size_t count, std::uint64_t value,
                      std::uint64_t stream, int bits);

// One phase of the grouped handshake, with constant flag values so that a CUDA graph can replay it as captured.
// With wait_event != 0 it first records wait_event on wait_stream and makes `stream` wait on it. Then, on `stream`,
// in one cuStreamBatchMemOp where the driver takes it (else one memop call each), in this order:
//   marker[0] = token, marker[1] = 0        (marker != 0: the watchdog sees the stream reach the phase)
//   *publish[i] = 1 for every i             (a fence first: earlier copies on `stream` land before the flag)
//   wait until *wait[i] == 1 for every i
//   *wait[i] = 0 for every i                (the bank is clean for its next use)
//   marker[1] = token                       (the phase passed)
// A rank's consecutive phases must alternate between two flag banks (see the copy engine's protocol): a peer can
// publish into a bank again only after this rank has reset it. `peers[i]` only names the peer in errors.
void stream_phase(const std::uint64_t* publish, const std::uint64_t* wait, const std::int64_t* peers,
                  std::size_t count, std::uint64_t marker, std::uint64_t token, std::uint64_t stream, int bits,
                  std::uint64_t wait_stream, std::uint64_t wait_event, int device);

// Whether `stream` is being captured into a CUDA graph (cudaStreamIsCapturing).
bool stream_is_capturing(std::uint64_t stream);

// cuMemGetAddressRange for `address` -> (allocation base, allocation size), with the
// owning device made current.
std::pair<std::uint64_t, std::uint64_t> address_range(std::uint64_t address);

// cudaIpcGetMemHandle of the allocation that contains `address` (on `device`).
// Writes the 64 handle bytes to handle_out and returns address - allocation base.
std::uint64_t ipc_get_handle(int device, std::uint64_t address, unsigned char* handle_out);

// cudaIpcOpenMemHandle(handle, cudaIpcMemLazyEnablePeerAccess) on the current device;
// checks that [offset, offset + max(nbytes, 1)) lies inside the mapping and returns base + offset.
std::uint64_t ipc_open_handle(const unsigned char* handle, std::uint64_t offset, std::uint64_t nbytes);

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
