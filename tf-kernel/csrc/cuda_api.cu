// CUDA side of tf_kernel: host API calls only, no kernels (yet).
//
// Driver API functions (stream memory operations, cuMemGetAddressRange, ...) are NOT
// linked: this library never links libcuda.so, so that it builds and loads on machines
// without an NVIDIA driver (CI). They are fetched at run time, lazily and once each,
// through cudaGetDriverEntryPointByVersion (cudaGetDriverEntryPoint is deprecated in
// CUDA 13.0); a missing driver or symbol raises a clear error on first use.
#include "cuda_api.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

namespace tf_kernel {
namespace cuda_api {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == kIpcHandleBytes, "cudaIpcMemHandle_t is expected to be 64 bytes");
static_assert(sizeof(CUdeviceptr) == 8, "64-bit device pointers expected");

// The driver ABI version we ask for. 12.0 is where the _v2 stream memory operations became
// the default cuStreamWriteValue32 & co; every driver able to run CUDA 13 code has it.
constexpr unsigned int kDriverAbiVersion = 12000;

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error("tf_kernel: " + what); }

std::string hex(std::uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

void check_cuda(cudaError_t err, const std::string& call) {
  if (err == cudaSuccess) return;
  // Clear the runtime's (non-sticky) last-error slot so that torch does not later report
  // our failure as the failure of an unrelated kernel launch.
  (void)cudaGetLastError();
  fail(call + " failed: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

// Resolves a driver symbol. Throws if the runtime cannot reach a driver or the driver lacks
// the symbol at the requested ABI version.
void* resolve_driver_symbol(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  cudaError_t err = cudaGetDriverEntryPointByVersion(name, &fn, kDriverAbiVersion, cudaEnableDefault, &status);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    fail(std::string("cannot resolve CUDA driver function ") + name +
         " via cudaGetDriverEntryPointByVersion: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
         "). tf_kernel loads the driver (libcuda.so.1) at run time; is an NVIDIA driver installed and a GPU visible?");
  }
  if (status != cudaDriverEntryPointSuccess || fn == nullptr) {
    fail(std::string("the installed CUDA driver does not provide ") + name + " at ABI version " +
         std::to_string(kDriverAbiVersion) +
         (status == cudaDriverEntryPointVersionNotSufficent ? " (driver too old)" : " (symbol not found)"));
  }
  return fn;
}

// Each accessor resolves its symbol on first use (function-local statics are initialised
// once and thread-safely; if resolution throws, the next call retries).
#define TFK_DRIVER_FN(accessor, symbol, pfn_type)                                      \
  pfn_type accessor() {                                                                \
    static const pfn_type fn = reinterpret_cast<pfn_type>(resolve_driver_symbol(symbol)); \
    return fn;                                                                         \
  }

TFK_DRIVER_FN(drv_get_error_name, "cuGetErrorName", PFN_cuGetErrorName_v6000)
TFK_DRIVER_FN(drv_get_error_string, "cuGetErrorString", PFN_cuGetErrorString_v6000)
TFK_DRIVER_FN(drv_ctx_get_current, "cuCtxGetCurrent", PFN_cuCtxGetCurrent_v4000)
TFK_DRIVER_FN(drv_mem_get_address_range, "cuMemGetAddressRange", PFN_cuMemGetAddressRange_v3020)
TFK_DRIVER_FN(drv_stream_write_value32, "cuStreamWriteValue32", PFN_cuStreamWriteValue32_v11070)
TFK_DRIVER_FN(drv_stream_write_value64, "cuStreamWriteValue64", PFN_cuStreamWriteValue64_v11070)
TFK_DRIVER_FN(drv_stream_wait_value32, "cuStreamWaitValue32", PFN_cuStreamWaitValue32_v11070)
TFK_DRIVER_FN(drv_stream_wait_value64, "cuStreamWaitValue64", PFN_cuStreamWaitValue64_v11070)

#undef TFK_DRIVER_FN

std::string driver_error_text(CUresult res) {
  std::string text = "CUresult " + std::to_string(static_cast<int>(res));
  try {
    const char* name = nullptr;
    const char* desc = nullptr;
    if (drv_get_error_name()(res, &name) == CUDA_SUCCESS && name != nullptr) text = name;
    if (drv_get_error_string()(res, &desc) == CUDA_SUCCESS && desc != nullptr) text += std::string(" (") + desc + ")";
  } catch (const std::exception&) {
    // Keep the numeric code if the error-string functions themselves cannot be resolved.
  }
  return text;
}

void check_cu(CUresult res, const std::string& call) {
  if (res == CUDA_SUCCESS) return;
  fail(call + " failed: " + driver_error_text(res));
}

// Driver calls need a current context on the calling thread. The runtime makes the primary
// context current lazily; a thread that has not yet made a runtime call may have none.
void ensure_context() {
  CUcontext ctx = nullptr;
  check_cu(drv_ctx_get_current()(&ctx), "cuCtxGetCurrent");
  if (ctx != nullptr) return;
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  // Since CUDA 12.0, cudaSetDevice initialises the primary context and makes it current.
  check_cuda(cudaSetDevice(dev), "cudaSetDevice(" + std::to_string(dev) + ")");
}

// Makes `device` current for the lifetime of the guard and restores the previous device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check_cuda(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ != device) {
      check_cuda(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
      changed_ = true;
    }
  }
  ~DeviceGuard() {
    if (changed_) {
      if (cudaSetDevice(prev_) != cudaSuccess) (void)cudaGetLastError();
    }
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
  bool changed_ = false;
};

// Device that owns a device (or IPC-mapped) pointer.
int device_of(std::uint64_t address) {
  cudaPointerAttributes attr{};
  check_cuda(cudaPointerGetAttributes(&attr, reinterpret_cast<const void*>(address)),
             "cudaPointerGetAttributes(" + hex(address) + ")");
  if (attr.type != cudaMemoryTypeDevice) {
    fail("address " + hex(address) + " is not CUDA device memory (cudaPointerAttributes.type=" +
         std::to_string(static_cast<int>(attr.type)) + ")");
  }
  return attr.device;
}

inline CUstream as_custream(std::uint64_t stream) { return reinterpret_cast<CUstream>(static_cast<std::uintptr_t>(stream)); }

void write_value(CUstream s, std::uint64_t address, std::uint64_t value, int bits, const std::string& what) {
  // Default flags: the write is preceded by a memory fence scoped to the stream, so every
  // copy issued earlier on this stream is visible before a peer can observe the new value.
  if (bits == 32) {
    check_cu(drv_stream_write_value32()(s, static_cast<CUdeviceptr>(address), static_cast<cuuint32_t>(value),
                                        CU_STREAM_WRITE_VALUE_DEFAULT),
             "cuStreamWriteValue32(" + what + ")");
  } else {
    check_cu(drv_stream_write_value64()(s, static_cast<CUdeviceptr>(address), static_cast<cuuint64_t>(value),
                                        CU_STREAM_WRITE_VALUE_DEFAULT),
             "cuStreamWriteValue64(" + what + ")");
  }
}

void wait_value_geq(CUstream s, std::uint64_t address, std::uint64_t value, int bits, const std::string& what) {
  // GEQ, not EQ: the comparison is cyclic, (intN_t)(*addr - value) >= 0, so it is satisfied
  // by `value` and by any later epoch. With EQ, a fast peer that already published epoch
  // e+1 over e (before this slow rank's wait for e was ever evaluated) would leave this
  // stream blocked forever. Being cyclic, it also keeps working when 32-bit epochs wrap
  // around 2^32, as long as peers are less than 2^31 epochs apart.
  if (bits == 32) {
    check_cu(drv_stream_wait_value32()(s, static_cast<CUdeviceptr>(address), static_cast<cuuint32_t>(value),
                                       CU_STREAM_WAIT_VALUE_GEQ),
             "cuStreamWaitValue32(" + what + ")");
  } else {
    check_cu(drv_stream_wait_value64()(s, static_cast<CUdeviceptr>(address), static_cast<cuuint64_t>(value),
                                       CU_STREAM_WAIT_VALUE_GEQ),
             "cuStreamWaitValue64(" + what + ")");
  }
}

}  // namespace

void copy_2d(int device, std::uint64_t dst, std::uint64_t dst_pitch, std::uint64_t dst_batch_stride,
             std::uint64_t src, std::uint64_t src_pitch, std::uint64_t src_batch_stride, std::uint64_t width,
             std::uint64_t height, std::uint64_t batch, std::uint64_t stream) {
  DeviceGuard guard(device);
  auto s = reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(stream));
  for (std::uint64_t b = 0; b < batch; ++b) {
    const std::uint64_t d = dst + b * dst_batch_stride;
    const std::uint64_t sp = src + b * src_batch_stride;
    cudaError_t err = cudaMemcpy2DAsync(reinterpret_cast<void*>(d), dst_pitch, reinterpret_cast<const void*>(sp),
                                        src_pitch, width, height, cudaMemcpyDefault, s);
    if (err != cudaSuccess) {
      check_cuda(err, "cudaMemcpy2DAsync(batch item " + std::to_string(b) + ", dst=" + hex(d) +
                          ", dpitch=" + std::to_string(dst_pitch) + ", src=" + hex(sp) +
                          ", spitch=" + std::to_string(src_pitch) + ", width=" + std::to_string(width) +
                          ", height=" + std::to_string(height) + ")");
    }
  }
}

void stream_write_value(std::uint64_t address, std::uint64_t value, std::uint64_t stream, int bits) {
  ensure_context();
  write_value(as_custream(stream), address, value, bits, hex(address));
}

void stream_wait_value_geq(std::uint64_t address, std::uint64_t value, std::uint64_t stream, int bits) {
  ensure_context();
  wait_value_geq(as_custream(stream), address, value, bits, hex(address));
}

void stream_handshake(const std::uint64_t* write_addresses, const std::uint64_t* wait_addresses,
                      const std::int64_t* peers, std::size_t count, std::uint64_t value, std::uint64_t stream,
                      int bits) {
  if (count == 0) return;
  ensure_context();
  CUstream s = as_custream(stream);
  // All publishes first, then all waits: no rank waits before it has published, so ranks
  // entering the handshake in any order cannot deadlock each other.
  for (std::size_t i = 0; i < count; ++i) {
    write_value(s, write_addresses[i], value, bits, "publish to peer " + std::to_string(peers[i]) + " at " + hex(write_addresses[i]));
  }
  for (std::size_t i = 0; i < count; ++i) {
    wait_value_geq(s, wait_addresses[i], value, bits, "wait for peer " + std::to_string(peers[i]) + " at " + hex(wait_addresses[i]));
  }
}

std::pair<std::uint64_t, std::uint64_t> address_range(std::uint64_t address) {
  DeviceGuard guard(device_of(address));
  ensure_context();
  CUdeviceptr base = 0;
  size_t size = 0;
  check_cu(drv_mem_get_address_range()(&base, &size, static_cast<CUdeviceptr>(address)),
           "cuMemGetAddressRange(" + hex(address) + ")");
  return {static_cast<std::uint64_t>(base), static_cast<std::uint64_t>(size)};
}

std::uint64_t ipc_get_handle(int device, std::uint64_t address, unsigned char* handle_out) {
  DeviceGuard guard(device);
  ensure_context();
  CUdeviceptr base = 0;
  size_t size = 0;
  check_cu(drv_mem_get_address_range()(&base, &size, static_cast<CUdeviceptr>(address)),
           "cuMemGetAddressRange(" + hex(address) + ")");
  cudaIpcMemHandle_t handle{};
  // Fails (cudaErrorInvalidValue / not supported) for memory that was not allocated with
  // cudaMalloc, e.g. torch's expandable segments (cuMemCreate/cuMemMap).
  check_cuda(cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(base)),
             "cudaIpcGetMemHandle(allocation base " + hex(base) + " of " + hex(address) + ")");
  std::memcpy(handle_out, handle.reserved, kIpcHandleBytes);
  return address - static_cast<std::uint64_t>(base);
}

std::uint64_t ipc_open_handle(const unsigned char* handle_bytes, std::uint64_t offset) {
  cudaIpcMemHandle_t handle{};
  std::memcpy(handle.reserved, handle_bytes, kIpcHandleBytes);
  void* base = nullptr;
  check_cuda(cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
  const auto base_addr = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(base));
  CUdeviceptr range_base = 0;
  size_t size = 0;
  CUresult res = CUDA_SUCCESS;
  try {
    ensure_context();
    res = drv_mem_get_address_range()(&range_base, &size, static_cast<CUdeviceptr>(base_addr));
  } catch (...) {
    (void)cudaIpcCloseMemHandle(base);
    throw;
  }
  if (res != CUDA_SUCCESS || offset >= size) {
    if (cudaIpcCloseMemHandle(base) != cudaSuccess) (void)cudaGetLastError();
    check_cu(res, "cuMemGetAddressRange(opened IPC mapping " + hex(base_addr) + ")");
    fail("IPC handle offset " + std::to_string(offset) + " lies outside the opened allocation of " +
         std::to_string(size) + " bytes (the mapping was closed again)");
  }
  return base_addr + offset;
}

void ipc_close_handle(std::uint64_t address) {
  DeviceGuard guard(device_of(address));
  ensure_context();
  CUdeviceptr base = 0;
  size_t size = 0;
  check_cu(drv_mem_get_address_range()(&base, &size, static_cast<CUdeviceptr>(address)),
           "cuMemGetAddressRange(" + hex(address) + ")");
  check_cuda(cudaIpcCloseMemHandle(reinterpret_cast<void*>(base)),
             "cudaIpcCloseMemHandle(mapping base " + hex(base) + " of " + hex(address) + ")");
}

int driver_version() {
  int v = 0;
  check_cuda(cudaDriverGetVersion(&v), "cudaDriverGetVersion");
  return v;
}

int runtime_version() {
  int v = 0;
  check_cuda(cudaRuntimeGetVersion(&v), "cudaRuntimeGetVersion");
  return v;
}

int compiled_runtime_version() { return CUDART_VERSION; }

}  // namespace cuda_api
}  // namespace tf_kernel
