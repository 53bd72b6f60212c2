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

#include <atomic>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

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
TFK_DRIVER_FN(drv_stream_batch_memop, "cuStreamBatchMemOp", PFN_cuStreamBatchMemOp_v11070)
TFK_DRIVER_FN(drv_device_get, "cuDeviceGet", PFN_cuDeviceGet_v2000)
TFK_DRIVER_FN(drv_device_get_attribute, "cuDeviceGetAttribute", PFN_cuDeviceGetAttribute_v2000)

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

// -1: not tried yet; 1: the batched call worked; 0: the runtime/driver refused it, so the per-call path is used.
std::atomic<int> g_copy_batch_mode{-1};
std::atomic<int> g_memop_batch_mode{-1};

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

// One write (default flags: a fence first, so earlier work on the stream is visible before the value) or one GEQ
// wait of a cuStreamBatchMemOp.
CUstreamBatchMemOpParams memop(bool wait, std::uint64_t address, std::uint64_t value, int bits) {
  CUstreamBatchMemOpParams op;
  std::memset(&op, 0, sizeof(op));
  if (wait) {
    auto& q = op.waitValue;
    q.operation = bits == 32 ? CU_STREAM_MEM_OP_WAIT_VALUE_32 : CU_STREAM_MEM_OP_WAIT_VALUE_64;
    q.address = static_cast<CUdeviceptr>(address);
    if (bits == 32) q.value = static_cast<cuuint32_t>(value); else q.value64 = static_cast<cuuint64_t>(value);
    q.flags = CU_STREAM_WAIT_VALUE_GEQ;
  } else {
    auto& w = op.writeValue;
    w.operation = bits == 32 ? CU_STREAM_MEM_OP_WRITE_VALUE_32 : CU_STREAM_MEM_OP_WRITE_VALUE_64;
    w.address = static_cast<CUdeviceptr>(address);
    if (bits == 32) w.value = static_cast<cuuint32_t>(value); else w.value64 = static_cast<cuuint64_t>(value);
    w.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
  }
  return op;
}

}  // namespace

namespace {

// One cudaMemcpy2DAsync per batch item; the caller holds the device guard.
void copy_2d_items(const PitchedCopyArgs& c, cudaStream_t s) {
  for (std::uint64_t b = 0; b < c.batch; ++b) {
    const std::uint64_t d = c.dst + b * c.dst_batch_stride;
    const std::uint64_t sp = c.src + b * c.src_batch_stride;
    cudaError_t err = cudaMemcpy2DAsync(reinterpret_cast<void*>(d), c.dst_pitch, reinterpret_cast<const void*>(sp),
                                        c.src_pitch, c.width, c.height, cudaMemcpyDefault, s);
    if (err != cudaSuccess) {
      check_cuda(err, "cudaMemcpy2DAsync(batch item " + std::to_string(b) + ", dst=" + hex(d) +
                          ", dpitch=" + std::to_string(c.dst_pitch) + ", src=" + hex(sp) +
                          ", spitch=" + std::to_string(c.src_pitch) + ", width=" + std::to_string(c.width) +
                          ", height=" + std::to_string(c.height) + ")");
    }
  }
}

#if CUDART_VERSION >= 12080
// The layer height of one side of a 3-D operation covering all batch items, or 0 when its batch stride is not a
// whole number of pitches at least `height` rows apart (then each batch item is its own operation).
std::uint64_t layer_rows(std::uint64_t batch_stride, std::uint64_t pitch, std::uint64_t height) {
  if (pitch == 0 || batch_stride % pitch != 0) return 0;
  const std::uint64_t rows = batch_stride / pitch;
  return rows >= height ? rows : 0;
}

cudaMemcpy3DOperand pointer_operand(std::uint64_t address, std::uint64_t pitch, std::uint64_t rows) {
  cudaMemcpy3DOperand op{};
  op.type = cudaMemcpyOperandTypePointer;
  op.op.ptr.ptr = reinterpret_cast<void*>(address);
  op.op.ptr.rowLength = pitch;  // pointer operands count bytes: the element size is 1
  op.op.ptr.layerHeight = rows;
  return op;
}

// Every copy in one cudaMemcpy3DBatchAsync; returns the runtime's answer (the caller decides what a refusal means).
cudaError_t copy_batched(const PitchedCopyArgs* copies, std::size_t count, cudaStream_t s) {
  std::vector<cudaMemcpy3DBatchOp> ops;
  ops.reserve(count);
  auto add = [&](std::uint64_t dst, std::uint64_t src, const PitchedCopyArgs& c, std::uint64_t depth,
                 std::uint64_t src_rows, std::uint64_t dst_rows) {
    cudaMemcpy3DBatchOp op{};
    op.src = pointer_operand(src, c.src_pitch, src_rows);
    op.dst = pointer_operand(dst, c.dst_pitch, dst_rows);
    op.extent = make_cudaExtent(c.width, c.height, depth);
    op.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    op.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    ops.push_back(op);
  };
  for (std::size_t i = 0; i < count; ++i) {
    const PitchedCopyArgs& c = copies[i];
    const std::uint64_t src_rows = layer_rows(c.src_batch_stride, c.src_pitch, c.height);
    const std::uint64_t dst_rows = layer_rows(c.dst_batch_stride, c.dst_pitch, c.height);
    if (c.batch == 1) {
      add(c.dst, c.src, c, 1, c.height, c.height);
    } else if (src_rows != 0 && dst_rows != 0) {
      add(c.dst, c.src, c, c.batch, src_rows, dst_rows);
    } else {
      for (std::uint64_t b = 0; b < c.batch; ++b) {
        add(c.dst + b * c.dst_batch_stride, c.src + b * c.src_batch_stride, c, 1, c.height, c.height);
      }
    }
  }
#if CUDART_VERSION >= 13000
  return cudaMemcpy3DBatchAsync(ops.size(), ops.data(), 0, s);
#else
  std::size_t fail_index = 0;
  return cudaMemcpy3DBatchAsync(ops.size(), ops.data(), &fail_index, 0, s);
#endif
}
#endif

}  // namespace

void copy_2d_batch(int device, const PitchedCopyArgs* copies, std::size_t count, std::uint64_t stream,
                   std::uint64_t wait_stream, std::uint64_t wait_event) {
  DeviceGuard guard(device);
  auto s = reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(stream));
  if (wait_event != 0) {
    auto ev = reinterpret_cast<cudaEvent_t>(static_cast<std::uintptr_t>(wait_event));
    auto ws = reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(wait_stream));
    check_cuda(cudaEventRecord(ev, ws), "cudaEventRecord(readiness event on the caller's stream)");
    check_cuda(cudaStreamWaitEvent(s, ev, 0), "cudaStreamWaitEvent(copy stream on the readiness event)");
  }
  if (count == 0) return;
#if CUDART_VERSION >= 12080
  // Batched copies cannot be captured (cudaErrorStreamCaptureUnsupported): a capture records one node per copy.
  if (g_copy_batch_mode.load() != 0 && !stream_is_capturing(stream)) {
    const cudaError_t err = copy_batched(copies, count, s);
    if (err == cudaSuccess) {
      g_copy_batch_mode.store(1);
      return;
    }
    (void)cudaGetLastError();
    if (g_copy_batch_mode.load() == 1) check_cuda(err, "cudaMemcpy3DBatchAsync");  // it worked before: a real error
    g_copy_batch_mode.store(0);  // refused from the start (old driver, unsupported memory): one call per copy
  }
#endif
  for (std::size_t i = 0; i < count; ++i) copy_2d_items(copies[i], s);
}

bool stream_is_capturing(std::uint64_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(stream)), &status),
             "cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}

int copy_batch_mode() { return g_copy_batch_mode.load(); }

int memop_batch_mode() { return g_memop_batch_mode.load(); }

std::uint64_t event_create(int device) {
  DeviceGuard guard(device);
  cudaEvent_t ev = nullptr;
  check_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(ev));
}

void event_destroy(std::uint64_t event) {
  check_cuda(cudaEventDestroy(reinterpret_cast<cudaEvent_t>(static_cast<std::uintptr_t>(event))), "cudaEventDestroy");
}

std::pair<int, int> stream_memop_support(int device) {
  DeviceGuard guard(device);
  ensure_context();
  int memops32 = 1, memops64 = 0;
  try {
    (void)drv_stream_write_value32();
    (void)drv_stream_wait_value32();
  } catch (const std::exception&) {
    memops32 = 0;
  }
  CUdevice dev = 0;
  check_cu(drv_device_get()(&dev, device), "cuDeviceGet(" + std::to_string(device) + ")");
  check_cu(drv_device_get_attribute()(&memops64, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, dev),
           "cuDeviceGetAttribute(CAN_USE_64_BIT_STREAM_MEM_OPS)");
  if (memops64 != 0) {
    try {
      (void)drv_stream_write_value64();
      (void)drv_stream_wait_value64();
    } catch (const std::exception&) {
      memops64 = 0;
    }
  }
  return {memops32, memops64 != 0 ? 1 : 0};
}

void copy_2d(int device, std::uint64_t dst, std::uint64_t dst_pitch, std::uint64_t dst_batch_stride,
             std::uint64_t src, std::uint64_t src_pitch, std::uint64_t src_batch_stride, std::uint64_t width,
             std::uint64_t height, std::uint64_t batch, std::uint64_t stream) {
  DeviceGuard guard(device);
  auto s = reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(stream));
  copy_2d_items({dst, dst_pitch, dst_batch_stride, src, src_pitch, src_batch_stride, width, height, batch}, s);
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
  if (g_memop_batch_mode.load() != 0 && 2 * count < 256) {  // one driver call; it takes fewer than 256 operations
    std::vector<CUstreamBatchMemOpParams> ops;
    ops.reserve(2 * count);
    for (std::size_t i = 0; i < count; ++i) ops.push_back(memop(false, write_addresses[i], value, bits));
    for (std::size_t i = 0; i < count; ++i) ops.push_back(memop(true, wait_addresses[i], value, bits));
    const CUresult res = drv_stream_batch_memop()(s, static_cast<unsigned int>(ops.size()), ops.data(), 0);
    if (res == CUDA_SUCCESS) {
      g_memop_batch_mode.store(1);
      return;
    }
    if (g_memop_batch_mode.load() == 1) {  // it worked before: a real error
      check_cu(res, "cuStreamBatchMemOp(" + std::to_string(ops.size()) + " handshake operations)");
    }
    g_memop_batch_mode.store(0);  // refused from the start: this driver takes memops one call each
  }
  for (std::size_t i = 0; i < count; ++i) {
    write_value(s, write_addresses[i], value, bits, "publish to peer " + std::to_string(peers[i]) + " at " + hex(write_addresses[i]));
  }
  for (std::size_t i = 0; i < count; ++i) {
    wait_value_geq(s, wait_addresses[i], value, bits, "wait for peer " + std::to_string(peers[i]) + " at " + hex(wait_addresses[i]));
  }
}

void stream_phase(const std::uint64_t* publish, const std::uint64_t* wait, const std::int64_t* peers,
                  std::size_t count, std::uint64_t marker, std::uint64_t token, std::uint64_t stream, int bits,
                  std::uint64_t wait_stream, std::uint64_t wait_event, int device) {
  DeviceGuard guard(device);
  ensure_context();
  CUstream s = as_custream(stream);
  if (wait_event != 0) {
    auto ev = reinterpret_cast<cudaEvent_t>(static_cast<std::uintptr_t>(wait_event));
    auto ws = reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(wait_stream));
    check_cuda(cudaEventRecord(ev, ws), "cudaEventRecord(readiness event on the caller's stream)");
    check_cuda(cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(s), ev, 0),
               "cudaStreamWaitEvent(copy stream on the readiness event)");
  }
  // Flags take only the values 0 and 1, so GEQ 1 (cyclic) is "equals 1".
  std::vector<CUstreamBatchMemOpParams> ops;
  ops.reserve(3 * count + 3);
  if (marker != 0) {
    ops.push_back(memop(false, marker, token, bits));
    ops.push_back(memop(false, marker + bits / 8, 0, bits));
  }
  for (std::size_t i = 0; i < count; ++i) ops.push_back(memop(false, publish[i], 1, bits));
  for (std::size_t i = 0; i < count; ++i) ops.push_back(memop(true, wait[i], 1, bits));
  for (std::size_t i = 0; i < count; ++i) ops.push_back(memop(false, wait[i], 0, bits));
  if (marker != 0) ops.push_back(memop(false, marker + bits / 8, token, bits));
  if (ops.empty()) return;
  if (g_memop_batch_mode.load() != 0 && ops.size() < 256) {
    const CUresult res = drv_stream_batch_memop()(s, static_cast<unsigned int>(ops.size()), ops.data(), 0);
    if (res == CUDA_SUCCESS) {
      g_memop_batch_mode.store(1);
      return;
    }
    if (g_memop_batch_mode.load() == 1) {  // it worked before: a real error
      check_cu(res, "cuStreamBatchMemOp(" + std::to_string(ops.size()) + " handshake phase operations)");
    }
    g_memop_batch_mode.store(0);
  }
  std::size_t peer = 0;
  for (const auto& op : ops) {
    const bool is_wait = op.operation == CU_STREAM_MEM_OP_WAIT_VALUE_32 || op.operation == CU_STREAM_MEM_OP_WAIT_VALUE_64;
    if (is_wait) {
      const std::uint64_t v = bits == 32 ? op.waitValue.value : op.waitValue.value64;
      wait_value_geq(s, op.waitValue.address, v, bits,
                     "phase wait for peer " + std::to_string(peers[peer++ % (count ? count : 1)]));
    } else {
      const std::uint64_t v = bits == 32 ? op.writeValue.value : op.writeValue.value64;
      write_value(s, op.writeValue.address, v, bits, "phase write at " + hex(op.writeValue.address));
    }
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

std::uint64_t ipc_open_handle(const unsigned char* handle_bytes, std::uint64_t offset, std::uint64_t nbytes) {
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
  const std::uint64_t span = nbytes == 0 ? 1 : nbytes;
  if (res != CUDA_SUCCESS || offset >= size || span > size - offset) {
    if (cudaIpcCloseMemHandle(base) != cudaSuccess) (void)cudaGetLastError();
    check_cu(res, "cuMemGetAddressRange(opened IPC mapping " + hex(base_addr) + ")");
    fail("IPC handle offset " + std::to_string(offset) + " + " + std::to_string(span) +
         " bytes lies outside the opened allocation of " + std::to_string(size) +
         " bytes (the mapping was closed again)");
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
