// torch-facing side of tf_kernel: operator schemas, argument validation, registration.
//
// Only torch/library.h and ATen core headers are used, never c10/cuda/* or ATen/cuda/*:
// those need a CUDA build of torch (c10/cuda/impl/cuda_cmake_macros.h), and this library
// must build and load with a CPU build of torch too (CI). Streams therefore come in as
// integers (torch.cuda.Stream.cuda_stream) and peer memory as raw device addresses.
//
// Every op is a catch-all kernel (m.def(schema, fn)), callable with any tensor device.
// Each op validates ALL of its arguments before making any CUDA call, so a CPU-only
// machine can exercise every validation path. The CUDA calls live in cuda_api.cu.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "cuda_api.h"

#ifndef TF_KERNEL_VERSION
#define TF_KERNEL_VERSION "unknown"
#endif
#ifndef TF_KERNEL_TORCH_VERSION
#define TF_KERNEL_TORCH_VERSION "unknown"
#endif
#ifndef TF_KERNEL_CUDA_ARCHS
#define TF_KERNEL_CUDA_ARCHS "unknown"
#endif
#ifndef TF_KERNEL_CUDART_LINKAGE
#define TF_KERNEL_CUDART_LINKAGE "unknown"
#endif

namespace tf_kernel {
namespace {

// Error messages are assembled here with std::to_string and string appends, and reach TORCH_CHECK as one
// std::string. Formatting integers through c10::str (an inline std::ostream << int64) crashed with a segfault
// under torch 2.11+cu130 on the GPU machine (docs/perf/2026-11-29/README.md); this path does not.
inline void append_part(std::string& out, const char* s) { out += s; }
inline void append_part(std::string& out, const std::string& s) { out += s; }
template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
inline void append_part(std::string& out, T value) { out += std::to_string(value); }
inline void append_part(std::string& out, const c10::Device& d) { out += d.str(); }
inline void append_part(std::string& out, c10::ScalarType t) { out += c10::toString(t); }

template <typename... Args>
std::string message(const Args&... args) {
  std::string out;
  (append_part(out, args), ...);
  return out;
}

#define TFK_CHECK(cond, ...) TORCH_CHECK((cond), ::tf_kernel::message(__VA_ARGS__))

constexpr std::int64_t kIpcHandleTensorBytes = static_cast<std::int64_t>(cuda_api::kIpcHandleBytes) + 8;

// Runs a cuda_api call and turns its std::runtime_error into a c10::Error (RuntimeError).
template <typename F>
auto cuda_call(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    TFK_CHECK(false, e.what());
  }
}

void check_stream(const char* op, std::int64_t stream) {
  TFK_CHECK(stream >= 0, op, ": stream must be a cudaStream_t passed as a non-negative int "
              "(torch.cuda.current_stream().cuda_stream; 0 is the legacy default stream), got ", stream);
}

// Returns the flag element size in bytes for `bits`.
std::int64_t check_bits(const char* op, std::int64_t bits) {
  TFK_CHECK(bits == 32 || bits == 64, op, ": bits must be 32 or 64, got ", bits);
  return bits / 8;
}

void check_address(const char* op, const std::string& name, std::int64_t address, std::int64_t align) {
  TFK_CHECK(address != 0, op, ": ", name, " is a null device address");
  TFK_CHECK(address > 0, op, ": ", name, " must be a device address passed as a positive int, got ", address);
  TFK_CHECK(address % align == 0, op, ": ", name, " (", address, ") must be ", align,
              "-byte aligned for ", align * 8, "-bit stream memory operations");
}

void check_value(const char* op, std::int64_t value, std::int64_t bits) {
  if (bits == 32) {
    TFK_CHECK(value >= 0 && value <= static_cast<std::int64_t>(std::numeric_limits<std::uint32_t>::max()), op,
                ": value must fit in an unsigned 32-bit word (0 <= value <= 4294967295) when bits=32, got ", value);
  }
  // bits == 64: any int64, reinterpreted as uint64.
}

std::int64_t checked_mul(const char* op, const char* what, std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  TFK_CHECK(!__builtin_mul_overflow(a, b, &r), op, ": ", what, " overflows int64 (", a, " * ", b, ")");
  return r;
}

std::int64_t checked_add(const char* op, const char* what, std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  TFK_CHECK(!__builtin_add_overflow(a, b, &r), op, ": ", what, " overflows int64 (", a, " + ", b, ")");
  return r;
}

// One past the last byte touched: offset + (batch-1)*batch_stride + (height-1)*pitch + width.
// Requires width, height, batch >= 1 and everything non-negative.
std::int64_t copy_extent(const char* op, const char* side, std::int64_t offset, std::int64_t pitch,
                         std::int64_t batch_stride, std::int64_t width, std::int64_t height, std::int64_t batch) {
  std::int64_t end = checked_add(op, side, offset, checked_mul(op, side, batch - 1, batch_stride));
  end = checked_add(op, side, end, checked_mul(op, side, height - 1, pitch));
  return checked_add(op, side, end, width);
}

// ---------------------------------------------------------------------------------------
// copy_2d
// ---------------------------------------------------------------------------------------
// Validates one pitched copy (every check of copy_2d but the source's device); returns whether it is empty.
bool check_copy(const char* op, const std::string& which, const at::Tensor& src, std::int64_t src_offset_bytes,
                std::int64_t src_pitch_bytes, std::int64_t src_batch_stride_bytes, std::int64_t dst_ptr,
                std::int64_t dst_capacity_bytes, std::int64_t dst_offset_bytes, std::int64_t dst_pitch_bytes,
                std::int64_t dst_batch_stride_bytes, std::int64_t width_bytes, std::int64_t height,
                std::int64_t batch) {
  const std::string w = which.empty() ? std::string() : which + ": ";
  auto non_negative = [&](const char* name, std::int64_t value) {
    TFK_CHECK(value >= 0, op, ": ", w, name, " must be >= 0, got ", value);
  };
  non_negative("src_offset_bytes", src_offset_bytes);
  non_negative("src_pitch_bytes", src_pitch_bytes);
  non_negative("src_batch_stride_bytes", src_batch_stride_bytes);
  non_negative("dst_capacity_bytes", dst_capacity_bytes);
  non_negative("dst_offset_bytes", dst_offset_bytes);
  non_negative("dst_pitch_bytes", dst_pitch_bytes);
  non_negative("dst_batch_stride_bytes", dst_batch_stride_bytes);
  non_negative("width_bytes", width_bytes);
  non_negative("height", height);
  non_negative("batch", batch);
  TFK_CHECK(dst_ptr > 0, op, ": ", w, "dst_ptr must be a non-null device address passed as a positive int, got ",
            dst_ptr);
  TFK_CHECK(dst_capacity_bytes <= std::numeric_limits<std::int64_t>::max() - dst_ptr, op, ": ", w,
              "dst_ptr + dst_capacity_bytes overflows the address space (dst_ptr=", dst_ptr,
              ", dst_capacity_bytes=", dst_capacity_bytes, ")");
  TFK_CHECK(width_bytes <= src_pitch_bytes, op, ": ", w, "width_bytes (", width_bytes,
            ") exceeds src_pitch_bytes (", src_pitch_bytes, ")");
  TFK_CHECK(width_bytes <= dst_pitch_bytes, op, ": ", w, "width_bytes (", width_bytes,
            ") exceeds dst_pitch_bytes (", dst_pitch_bytes, ")");

  const bool empty = width_bytes == 0 || height == 0 || batch == 0;
  if (!empty) {
    // Source bounds: against the bytes of src's storage at or after src.data_ptr() (the
    // source is typically a strided view, e.g. V of a fused [B,S,3,H,D] QKV, whose rows
    // run across Q and K of later rows; its own numel does not bound what may be read).
    TFK_CHECK(src.has_storage(), op, ": src has no storage");
    const std::int64_t storage_bytes = static_cast<std::int64_t>(src.storage().nbytes());
    const std::int64_t before = checked_mul(op, "src storage offset", src.storage_offset(),
                                            static_cast<std::int64_t>(src.element_size()));
    const std::int64_t available = storage_bytes - before;
    const std::int64_t src_end = copy_extent(op, "source extent", src_offset_bytes, src_pitch_bytes,
                                             src_batch_stride_bytes, width_bytes, height, batch);
    TFK_CHECK(src_end <= available, op, ": ", w, "source read out of bounds: the last byte read ends ", src_end,
                " bytes after src.data_ptr() (src_offset_bytes=", src_offset_bytes, " + (batch-1)*src_batch_stride_bytes=",
                (batch - 1), "*", src_batch_stride_bytes, " + (height-1)*src_pitch_bytes=", (height - 1), "*",
                src_pitch_bytes, " + width_bytes=", width_bytes, "), but src's storage only has ", available,
                " bytes from src.data_ptr() on");
    const std::int64_t dst_end = copy_extent(op, "destination extent", dst_offset_bytes, dst_pitch_bytes,
                                             dst_batch_stride_bytes, width_bytes, height, batch);
    TFK_CHECK(dst_end <= dst_capacity_bytes, op, ": ", w, "destination write out of bounds: the last byte written ends ",
                dst_end, " bytes after dst_ptr (dst_offset_bytes=", dst_offset_bytes,
                " + (batch-1)*dst_batch_stride_bytes=", (batch - 1), "*", dst_batch_stride_bytes,
                " + (height-1)*dst_pitch_bytes=", (height - 1), "*", dst_pitch_bytes, " + width_bytes=", width_bytes,
                "), but dst_capacity_bytes is ", dst_capacity_bytes);
  }
  return empty;
}

std::uint64_t src_address(const char* op, const at::Tensor& src) {
  const void* src_data = src.const_data_ptr();
  TFK_CHECK(src_data != nullptr, op, ": src has a null data pointer");
  return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(src_data));
}

cuda_api::PitchedCopyArgs copy_args(std::uint64_t src_addr, std::int64_t src_offset_bytes, std::int64_t src_pitch_bytes,
                                    std::int64_t src_batch_stride_bytes, std::int64_t dst_ptr,
                                    std::int64_t dst_offset_bytes, std::int64_t dst_pitch_bytes,
                                    std::int64_t dst_batch_stride_bytes, std::int64_t width_bytes,
                                    std::int64_t height, std::int64_t batch) {
  auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  return {u(dst_ptr + dst_offset_bytes), u(dst_pitch_bytes), u(dst_batch_stride_bytes),
          src_addr + u(src_offset_bytes), u(src_pitch_bytes), u(src_batch_stride_bytes),
          u(width_bytes), u(height), u(batch)};
}

void copy_2d(const at::Tensor& src, std::int64_t src_offset_bytes, std::int64_t src_pitch_bytes,
             std::int64_t src_batch_stride_bytes, std::int64_t dst_ptr, std::int64_t dst_capacity_bytes,
             std::int64_t dst_offset_bytes, std::int64_t dst_pitch_bytes, std::int64_t dst_batch_stride_bytes,
             std::int64_t width_bytes, std::int64_t height, std::int64_t batch, std::int64_t stream) {
  constexpr const char* op = "tf_kernel.copy_2d";
  TFK_CHECK(src.defined(), op, ": src is an undefined tensor");
  check_stream(op, stream);
  const bool empty = check_copy(op, "", src, src_offset_bytes, src_pitch_bytes, src_batch_stride_bytes, dst_ptr,
                                dst_capacity_bytes, dst_offset_bytes, dst_pitch_bytes, dst_batch_stride_bytes,
                                width_bytes, height, batch);
  // The device check comes after the geometry checks on purpose: CPU-only CI can then
  // exercise every geometry check with a CPU tensor.
  TFK_CHECK(src.is_cuda(), op, ": src must be a CUDA tensor, got a tensor on ", src.device());
  if (empty) return;  // width, height or batch == 0: validated no-op
  const auto args = copy_args(src_address(op, src), src_offset_bytes, src_pitch_bytes, src_batch_stride_bytes, dst_ptr,
                              dst_offset_bytes, dst_pitch_bytes, dst_batch_stride_bytes, width_bytes, height, batch);
  cuda_call([&] {
    cuda_api::copy_2d(static_cast<int>(src.get_device()), args.dst, args.dst_pitch, args.dst_batch_stride, args.src,
                      args.src_pitch, args.src_batch_stride, args.width, args.height, args.batch,
                      static_cast<std::uint64_t>(stream));
  });
}

// copies: 11 ints per copy -- dst_ptr, dst_capacity_bytes, src_offset_bytes, src_pitch_bytes,
// src_batch_stride_bytes, dst_offset_bytes, dst_pitch_bytes, dst_batch_stride_bytes, width_bytes, height, batch.
constexpr std::size_t kCopyFields = 11;

void copy_2d_batch(const at::Tensor& src, c10::ArrayRef<std::int64_t> copies, std::int64_t stream,
                   std::int64_t wait_stream, std::int64_t wait_event) {
  constexpr const char* op = "tf_kernel.copy_2d_batch";
  TFK_CHECK(src.defined(), op, ": src is an undefined tensor");
  TFK_CHECK(copies.size() % kCopyFields == 0, op, ": copies must hold ", kCopyFields,
            " ints per copy (dst_ptr, dst_capacity_bytes, src_offset_bytes, src_pitch_bytes, src_batch_stride_bytes, "
            "dst_offset_bytes, dst_pitch_bytes, dst_batch_stride_bytes, width_bytes, height, batch), got ",
            copies.size(), " ints");
  check_stream(op, stream);
  TFK_CHECK(wait_event >= 0, op, ": wait_event must be 0 (none) or a cudaEvent_t from event_create, got ", wait_event);
  if (wait_event != 0) check_stream(op, wait_stream);
  const std::size_t count = copies.size() / kCopyFields;
  std::vector<bool> empty(count);
  for (std::size_t i = 0; i < count; ++i) {
    const std::int64_t* c = copies.data() + i * kCopyFields;
    empty[i] = check_copy(op, "copy " + std::to_string(i), src, c[2], c[3], c[4], c[0], c[1], c[5], c[6], c[7], c[8],
                          c[9], c[10]);
  }
  TFK_CHECK(src.is_cuda(), op, ": src must be a CUDA tensor, got a tensor on ", src.device());
  std::vector<cuda_api::PitchedCopyArgs> args;
  args.reserve(count);
  const std::uint64_t base = count > 0 ? src_address(op, src) : 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (empty[i]) continue;
    const std::int64_t* c = copies.data() + i * kCopyFields;
    args.push_back(copy_args(base, c[2], c[3], c[4], c[0], c[5], c[6], c[7], c[8], c[9], c[10]));
  }
  cuda_call([&] {
    cuda_api::copy_2d_batch(static_cast<int>(src.get_device()), args.data(), args.size(),
                            static_cast<std::uint64_t>(stream), static_cast<std::uint64_t>(wait_stream),
                            static_cast<std::uint64_t>(wait_event));
  });
}

std::int64_t event_create(std::int64_t device) {
  constexpr const char* op = "tf_kernel.event_create";
  TFK_CHECK(device >= 0, op, ": device must be a CUDA device index, got ", device);
  return cuda_call([&] { return static_cast<std::int64_t>(cuda_api::event_create(static_cast<int>(device))); });
}

void event_destroy(std::int64_t event) {
  constexpr const char* op = "tf_kernel.event_destroy";
  TFK_CHECK(event > 0, op, ": event must be a cudaEvent_t returned by event_create, got ", event);
  cuda_call([&] { cuda_api::event_destroy(static_cast<std::uint64_t>(event)); });
}

std::tuple<std::int64_t, std::int64_t> stream_memop_support(std::int64_t device) {
  constexpr const char* op = "tf_kernel.stream_memop_support";
  TFK_CHECK(device >= 0, op, ": device must be a CUDA device index, got ", device);
  const auto support = cuda_call([&] { return cuda_api::stream_memop_support(static_cast<int>(device)); });
  return {support.first, support.second};
}

std::tuple<std::int64_t, std::int64_t> submission_modes() {
  return {cuda_api::copy_batch_mode(), cuda_api::memop_batch_mode()};
}

// ---------------------------------------------------------------------------------------
// Stream memory operations
// ---------------------------------------------------------------------------------------
void stream_write_value(std::int64_t address, std::int64_t value, std::int64_t stream, std::int64_t bits) {
  constexpr const char* op = "tf_kernel.stream_write_value";
  const std::int64_t elem = check_bits(op, bits);
  check_address(op, "address", address, elem);
  check_value(op, value, bits);
  check_stream(op, stream);
  cuda_call([&] {
    cuda_api::stream_write_value(static_cast<std::uint64_t>(address), static_cast<std::uint64_t>(value),
                                 static_cast<std::uint64_t>(stream), static_cast<int>(bits));
  });
}

void stream_wait_value(std::int64_t address, std::int64_t value, std::int64_t stream, std::int64_t bits) {
  constexpr const char* op = "tf_kernel.stream_wait_value";
  const std::int64_t elem = check_bits(op, bits);
  check_address(op, "address", address, elem);
  check_value(op, value, bits);
  check_stream(op, stream);
  // Waits until (intN_t)(*address - value) >= 0: see cuda_api.cu for why GEQ and not EQ.
  cuda_call([&] {
    cuda_api::stream_wait_value_geq(static_cast<std::uint64_t>(address), static_cast<std::uint64_t>(value),
                                    static_cast<std::uint64_t>(stream), static_cast<int>(bits));
  });
}

// Flag arrays are bank-major, world_size slots per bank. Checks the arrays of one handshake before any CUDA call.
void check_flag_arrays(const char* op, c10::ArrayRef<std::int64_t> peer_flag_ptrs, std::int64_t local_flag_ptr,
                       std::int64_t rank, std::int64_t world_size, std::int64_t elem) {
  TFK_CHECK(world_size >= 1, op, ": world_size must be >= 1, got ", world_size);
  TFK_CHECK(static_cast<std::int64_t>(peer_flag_ptrs.size()) == world_size, op, ": len(peer_flag_ptrs) (",
            peer_flag_ptrs.size(), ") must equal world_size (", world_size, ")");
  TFK_CHECK(rank >= 0 && rank < world_size, op, ": rank must satisfy 0 <= rank < world_size (", world_size,
            "), got ", rank);
  check_address(op, "local_flag_ptr", local_flag_ptr, elem);
  for (std::int64_t p = 0; p < world_size; ++p) {
    if (p == rank) continue;  // our own entry is not used (may be 0 or local_flag_ptr)
    check_address(op, "peer_flag_ptrs[" + std::to_string(p) + "]", peer_flag_ptrs[p], elem);
  }
}

// Where one handshake writes and waits, per peer: slot `rank` of bank `bank` in the peer's array, slot p of the
// same bank in the local array.
struct FlagSlots {
  std::vector<std::uint64_t> publish, wait;
  std::vector<std::int64_t> peers;
};

FlagSlots flag_slots(c10::ArrayRef<std::int64_t> peer_flag_ptrs, std::int64_t local_flag_ptr, std::int64_t rank,
                     std::int64_t world_size, std::int64_t elem, std::int64_t bank) {
  FlagSlots slots;
  const auto u_elem = static_cast<std::uint64_t>(elem);
  const auto base = static_cast<std::uint64_t>(bank * world_size) * u_elem;
  for (std::int64_t p = 0; p < world_size; ++p) {
    if (p == rank) continue;
    slots.publish.push_back(static_cast<std::uint64_t>(peer_flag_ptrs[p]) + base + static_cast<std::uint64_t>(rank) * u_elem);
    slots.wait.push_back(static_cast<std::uint64_t>(local_flag_ptr) + base + static_cast<std::uint64_t>(p) * u_elem);
    slots.peers.push_back(p);
  }
  return slots;
}

void stream_handshake(c10::ArrayRef<std::int64_t> peer_flag_ptrs, std::int64_t local_flag_ptr, std::int64_t rank,
                      std::int64_t world_size, std::int64_t epoch, std::int64_t stream, std::int64_t bits) {
  constexpr const char* op = "tf_kernel.stream_handshake";
  const std::int64_t elem = check_bits(op, bits);
  check_flag_arrays(op, peer_flag_ptrs, local_flag_ptr, rank, world_size, elem);
  TFK_CHECK(epoch > 0, op, ": epoch must be > 0 (flag arrays start zeroed, so epoch 0 would never wait), got ",
            epoch);
  check_stream(op, stream);
  if (world_size == 1) return;  // nobody to synchronise with

  // With 32-bit flags only the low 32 bits of the epoch are published and compared; the
  // cyclic GEQ comparison makes that wrap around 2^32 correctly.
  const std::uint64_t value =
      bits == 32 ? (static_cast<std::uint64_t>(epoch) & 0xffffffffull) : static_cast<std::uint64_t>(epoch);
  const FlagSlots slots = flag_slots(peer_flag_ptrs, local_flag_ptr, rank, world_size, elem, 0);
  cuda_call([&] {
    cuda_api::stream_handshake(slots.publish.data(), slots.wait.data(), slots.peers.data(), slots.publish.size(), value,
                               static_cast<std::uint64_t>(stream), static_cast<int>(bits));
  });
}

// One phase of the grouped handshake over flag arrays of 2 banks x world_size slots (bank-major): publish 1 into
// slot `rank` of bank `bank` of every peer's array, wait for slot p of the same bank of the local array to be 1 for
// every peer p, reset those slots to 0. See cuda_api.h for the order and the marker.
void stream_phase(c10::ArrayRef<std::int64_t> peer_flag_ptrs, std::int64_t local_flag_ptr, std::int64_t rank,
                  std::int64_t world_size, std::int64_t bank, std::int64_t marker_ptr, std::int64_t token,
                  std::int64_t stream, std::int64_t bits, std::int64_t wait_stream, std::int64_t wait_event,
                  std::int64_t device) {
  constexpr const char* op = "tf_kernel.stream_phase";
  const std::int64_t elem = check_bits(op, bits);
  TFK_CHECK(bank == 0 || bank == 1, op, ": bank must be 0 or 1, got ", bank);
  TFK_CHECK(marker_ptr >= 0, op, ": marker_ptr must be 0 (none) or an address, got ", marker_ptr);
  if (marker_ptr != 0) {
    check_address(op, "marker_ptr", marker_ptr, elem);
    TFK_CHECK(token > 0, op, ": token must be > 0 (0 means 'in the wait' to the watchdog), got ", token);
    check_value(op, token, bits);
  }
  check_stream(op, stream);
  TFK_CHECK(wait_event >= 0, op, ": wait_event must be 0 (none) or a cudaEvent_t from event_create, got ", wait_event);
  if (wait_event != 0) check_stream(op, wait_stream);
  TFK_CHECK(device >= 0, op, ": device must be a CUDA device index, got ", device);
  check_flag_arrays(op, peer_flag_ptrs, local_flag_ptr, rank, world_size, elem);
  const FlagSlots slots = flag_slots(peer_flag_ptrs, local_flag_ptr, rank, world_size, elem, bank);
  cuda_call([&] {
    cuda_api::stream_phase(slots.publish.data(), slots.wait.data(), slots.peers.data(), slots.publish.size(),
                           static_cast<std::uint64_t>(marker_ptr), static_cast<std::uint64_t>(token),
                           static_cast<std::uint64_t>(stream), static_cast<int>(bits),
                           static_cast<std::uint64_t>(wait_stream), static_cast<std::uint64_t>(wait_event),
                           static_cast<int>(device));
  });
}

bool stream_is_capturing(std::int64_t stream) {
  constexpr const char* op = "tf_kernel.stream_is_capturing";
  check_stream(op, stream);
  return cuda_call([&] { return cuda_api::stream_is_capturing(static_cast<std::uint64_t>(stream)); });
}

// ---------------------------------------------------------------------------------------
// CUDA IPC
// ---------------------------------------------------------------------------------------
at::Tensor ipc_get_handle(const at::Tensor& t) {
  constexpr const char* op = "tf_kernel.ipc_get_handle";
  TFK_CHECK(t.defined(), op, ": tensor is undefined");
  TFK_CHECK(t.is_cuda(), op, ": tensor must be a CUDA tensor, got a tensor on ", t.device());
  const void* data = t.const_data_ptr();
  TFK_CHECK(data != nullptr, op, ": tensor has a null data pointer (empty tensor?)");
  at::Tensor out = at::empty({kIpcHandleTensorBytes}, at::TensorOptions().dtype(at::kByte).device(at::kCPU));
  auto* bytes = out.mutable_data_ptr<std::uint8_t>();
  const auto addr = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(data));
  const std::uint64_t offset =
      cuda_call([&] { return cuda_api::ipc_get_handle(static_cast<int>(t.get_device()), addr, bytes); });
  for (int i = 0; i < 8; ++i) {  // little-endian uint64 after the 64 handle bytes
    bytes[cuda_api::kIpcHandleBytes + i] = static_cast<std::uint8_t>((offset >> (8 * i)) & 0xff);
  }
  return out;
}

std::int64_t ipc_open_handle(const at::Tensor& handle, std::int64_t nbytes) {
  constexpr const char* op = "tf_kernel.ipc_open_handle";
  TFK_CHECK(nbytes >= 0, op, ": nbytes must be >= 0 (0: only the offset is checked), got ", nbytes);
  TFK_CHECK(handle.defined(), op, ": handle is undefined");
  TFK_CHECK(handle.device().is_cpu(), op, ": handle must be a CPU tensor, got a tensor on ", handle.device());
  TFK_CHECK(handle.scalar_type() == at::kByte, op, ": handle must have dtype torch.uint8, got ",
              handle.scalar_type());
  TFK_CHECK(handle.numel() == kIpcHandleTensorBytes, op, ": handle must have exactly ", kIpcHandleTensorBytes,
              " bytes (64-byte cudaIpcMemHandle_t + 8-byte offset), got ", handle.numel());
  const at::Tensor h = handle.contiguous();
  const auto* bytes = h.const_data_ptr<std::uint8_t>();
  bool all_zero = true;
  for (std::size_t i = 0; i < cuda_api::kIpcHandleBytes; ++i) all_zero = all_zero && bytes[i] == 0;
  TFK_CHECK(!all_zero, op, ": malformed handle: the 64 cudaIpcMemHandle_t bytes are all zero");
  std::uint64_t offset = 0;
  for (int i = 0; i < 8; ++i) offset |= static_cast<std::uint64_t>(bytes[cuda_api::kIpcHandleBytes + i]) << (8 * i);
  TFK_CHECK(offset <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()), op,
              ": malformed handle: offset ", offset, " does not fit in int64");
  std::uint8_t raw[cuda_api::kIpcHandleBytes];
  std::memcpy(raw, bytes, sizeof(raw));
  const std::uint64_t ptr =
      cuda_call([&] { return cuda_api::ipc_open_handle(raw, offset, static_cast<std::uint64_t>(nbytes)); });
  return static_cast<std::int64_t>(ptr);
}

void ipc_close_handle(std::int64_t ptr) {
  constexpr const char* op = "tf_kernel.ipc_close_handle";
  TFK_CHECK(ptr > 0, op, ": ptr must be a non-null device address returned by ipc_open_handle, got ", ptr);
  cuda_call([&] { cuda_api::ipc_close_handle(static_cast<std::uint64_t>(ptr)); });
}

std::tuple<std::int64_t, std::int64_t> get_address_range(std::int64_t ptr) {
  constexpr const char* op = "tf_kernel.get_address_range";
  TFK_CHECK(ptr > 0, op, ": ptr must be a non-null device address, got ", ptr);
  const auto range = cuda_call([&] { return cuda_api::address_range(static_cast<std::uint64_t>(ptr)); });
  return {static_cast<std::int64_t>(range.first), static_cast<std::int64_t>(range.second)};
}

// ---------------------------------------------------------------------------------------
// Introspection
// ---------------------------------------------------------------------------------------
std::string build_info() {
  return std::string("tf_kernel=") + TF_KERNEL_VERSION + ";torch=" + TF_KERNEL_TORCH_VERSION +
         ";cuda_archs=" + TF_KERNEL_CUDA_ARCHS + ";cudart=" + TF_KERNEL_CUDART_LINKAGE +
         ";cudart_headers=" + std::to_string(cuda_api::compiled_runtime_version()) +
         ";cxx11_abi=" + std::to_string(_GLIBCXX_USE_CXX11_ABI);
}

std::int64_t driver_version() {
  return cuda_call([] { return static_cast<std::int64_t>(cuda_api::driver_version()); });
}

std::int64_t runtime_version() {
  return cuda_call([] { return static_cast<std::int64_t>(cuda_api::runtime_version()); });
}

}  // namespace
}  // namespace tf_kernel

TORCH_LIBRARY(tf_kernel, m) {
  m.def(
      "copy_2d(Tensor src, int src_offset_bytes, int src_pitch_bytes, int src_batch_stride_bytes, int dst_ptr, "
      "int dst_capacity_bytes, int dst_offset_bytes, int dst_pitch_bytes, int dst_batch_stride_bytes, "
      "int width_bytes, int height, int batch, int stream) -> ()",
      &tf_kernel::copy_2d);
  m.def("copy_2d_batch(Tensor src, int[] copies, int stream, int wait_stream=0, int wait_event=0) -> ()",
        &tf_kernel::copy_2d_batch);
  m.def("event_create(int device) -> int", &tf_kernel::event_create);
  m.def("event_destroy(int event) -> ()", &tf_kernel::event_destroy);
  m.def("stream_memop_support(int device) -> (int, int)", &tf_kernel::stream_memop_support);
  m.def("submission_modes() -> (int, int)", &tf_kernel::submission_modes);
  m.def("stream_write_value(int address, int value, int stream, int bits) -> ()", &tf_kernel::stream_write_value);
  m.def("stream_wait_value(int address, int value, int stream, int bits) -> ()", &tf_kernel::stream_wait_value);
  m.def(
      "stream_handshake(int[] peer_flag_ptrs, int local_flag_ptr, int rank, int world_size, int epoch, int stream, "
      "int bits) -> ()",
      &tf_kernel::stream_handshake);
  m.def(
      "stream_phase(int[] peer_flag_ptrs, int local_flag_ptr, int rank, int world_size, int bank, int marker_ptr, "
      "int token, int stream, int bits, int wait_stream=0, int wait_event=0, int device=0) -> ()",
      &tf_kernel::stream_phase);
  m.def("stream_is_capturing(int stream) -> bool", &tf_kernel::stream_is_capturing);
  m.def("ipc_get_handle(Tensor t) -> Tensor", &tf_kernel::ipc_get_handle);
  m.def("ipc_open_handle(Tensor handle, int nbytes=0) -> int", &tf_kernel::ipc_open_handle);
  m.def("ipc_close_handle(int ptr) -> ()", &tf_kernel::ipc_close_handle);
  m.def("get_address_range(int ptr) -> (int, int)", &tf_kernel::get_address_range);
  m.def("build_info() -> str", &tf_kernel::build_info);
  m.def("driver_version() -> int", &tf_kernel::driver_version);
  m.def("runtime_version() -> int", &tf_kernel::runtime_version);
}
