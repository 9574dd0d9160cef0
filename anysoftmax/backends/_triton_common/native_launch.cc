// Launches Triton-compiled CUDA kernels from C++, called through TVM-FFI with torch tensors:
// the repeated request's launch (argument packing, current stream) without
// the Python of Triton's launcher. native_launch.py builds this file, derives each kernel's
// parameter list from its compiled signature and describes it to `make_launcher`.
//
// libcuda is opened at run time (dlopen), as Triton's own launcher does, so this builds on
// machines without CUDA; cuda.h comes from the Triton wheel.
#include <dlfcn.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "cuda.h"

namespace ffi = tvm::ffi;

namespace {

// The most tensor, float, per-call integer and kernel parameters a launcher takes: the softmax
// kernels take under 50 parameters; a larger kernel is refused when the launcher is made.
constexpr int kMaxTensors = 24;  // merge_states at K = 8: 8 partials, 8 lses, out, lse
constexpr int kMaxValues = 8;
constexpr int kMaxInts = 8;  // the sampler's scan and select: top_k, seed and offset words, flags
constexpr int kMaxParams = 96;

// How one kernel parameter gets its value: a constant (integers, scratch pointers: the bits
// as the kernel reads them, little-endian), the address of tensor argument `index`, float
// argument `index` stored as fp32 / fp64 (`bits`: its value when the call passes no floats),
// or per-call integer `index` stored as a signed / unsigned integer of `bits` bytes (1, 2, 4, 8).
enum Kind : int64_t { kConstant = 0, kPointer = 1, kFloat32 = 2, kFloat64 = 3, kInt = 4, kUint = 5 };

struct Param {
  int64_t kind, index;
  uint64_t bits;
};

struct Kernel {
  CUfunction function;
  unsigned grid, block, shared;
  bool cooperative, pdl;
  std::vector<Param> params;
};

struct Driver {
  CUresult (*launch)(const CUlaunchConfig*, CUfunction, void**, void**);
  CUresult (*ctx_get_current)(CUcontext*);
  CUresult (*ctx_set_current)(CUcontext);
  CUresult (*device_get)(CUdevice*, int);
  CUresult (*primary_ctx_retain)(CUcontext*, CUdevice);
  CUresult (*error_name)(CUresult, const char**);
  CUresult (*error_string)(CUresult, const char**);
};

template <typename F>
void resolve(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  if (*out == nullptr) TVM_FFI_THROW(RuntimeError) << "libcuda.so.1 has no " << name;
}

const Driver& driver() {
  // (a function-local static: initialised once, thread-safe; retried if it threw)
  static const Driver d = [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) TVM_FFI_THROW(RuntimeError) << "cannot open libcuda.so.1: " << dlerror();
    Driver r;
    resolve(lib, "cuLaunchKernelEx", &r.launch);
    resolve(lib, "cuCtxGetCurrent", &r.ctx_get_current);
    resolve(lib, "cuCtxSetCurrent", &r.ctx_set_current);
    resolve(lib, "cuDeviceGet", &r.device_get);
    resolve(lib, "cuDevicePrimaryCtxRetain", &r.primary_ctx_retain);
    resolve(lib, "cuGetErrorName", &r.error_name);
    resolve(lib, "cuGetErrorString", &r.error_string);
    return r;
  }();
  return d;
}

void check(CUresult status, const char* what) {
  if (status == CUDA_SUCCESS) return;
  const char* name = "CUDA error";
  const char* text = "";
  driver().error_name(status, &name);
  driver().error_string(status, &text);
  // (the text names a refused cooperative launch: the Python launcher falls back on it)
  TVM_FFI_THROW(RuntimeError) << what << ": " << name << ": " << text;
}

// A thread that never touched CUDA has no current context: make the device's primary context
// (the one torch and Triton load kernels into) current, as Triton's launcher does.
void ensure_context(int device) {
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  check(d.ctx_get_current(&ctx), "cuCtxGetCurrent");
  if (ctx != nullptr) return;
  CUdevice dev;
  check(d.device_get(&dev, device), "cuDeviceGet");
  check(d.primary_ctx_retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  check(d.ctx_set_current(ctx), "cuCtxSetCurrent");
}

void launch_one(const Kernel& k, const uint64_t* slots, CUstream stream) {
  void* params[kMaxParams];
  for (size_t i = 0; i < k.params.size(); ++i) params[i] = const_cast<uint64_t*>(slots + i);
  // The attributes Triton's launcher sets for these kernels (one CTA per program: num_ctas 1).
  CUlaunchAttribute attrs[2] = {};
  unsigned n_attrs = 0;
  if (k.pdl) {
    attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attrs[n_attrs++].value.programmaticStreamSerializationAllowed = 1;
  }
  if (k.cooperative) {
    attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attrs[n_attrs++].value.cooperative = 1;
  }
  CUlaunchConfig config{};
  config.gridDimX = k.grid;
  config.gridDimY = config.gridDimZ = 1;
  config.blockDimX = k.block;
  config.blockDimY = config.blockDimZ = 1;
  config.sharedMemBytes = k.shared;
  config.hStream = stream;
  config.attrs = attrs;
  config.numAttrs = n_attrs;
  check(driver().launch(&config, k.function, params, nullptr), "cuLaunchKernelEx");
}

// Per-call integer `value` as a kernel parameter of `bytes` bytes, signed or not: its low bytes,
// the rest zero, as Triton's launcher stores an int32_t / uint64_t / ... parameter. A value
// out of the type's range is refused: the kernel was compiled for that type (Triton types an
// integer by its value), so truncating it would silently launch with another value.
uint64_t int_bits(int64_t value, int64_t bytes, bool is_unsigned, int j, int argument) {
  const int width = static_cast<int>(8 * bytes);
  const int64_t half = width == 64 ? 0 : int64_t{1} << (width - 1);
  bool fits = is_unsigned ? value >= 0 && (width == 64 || value < 2 * half)
                          : width == 64 || (value >= -half && value < half);
  if (!fits) {
    TVM_FFI_THROW(ValueError) << "per-call integer " << j << " (argument " << argument << ") is " << value
                              << ", which does not fit " << (is_unsigned ? "u" : "i") << width;
  }
  return width == 64 ? static_cast<uint64_t>(value) : static_cast<uint64_t>(value) & ((uint64_t{1} << width) - 1);
}

// The launcher of one bound request. Called as f(*tensors) or f(*tensors, *floats), or, when it
// was made for per-call integers, f(*tensors, *floats, *ints) (all three, always): tensors (None
// where the request has no such operand; an integer: an operand's address, at least one a tensor)
// in the order the launcher was made for. With `run`
// false nothing is launched and the packed parameters of every kernel are returned (tests check
// them without a GPU).
class Launcher {
 public:
  Launcher(int device_type, int device, std::vector<bool> used, int n_values, int n_ints, std::vector<Kernel> kernels,
           bool run)
      : device_type_(device_type), device_(device), used_(std::move(used)), n_values_(n_values), n_ints_(n_ints),
        kernels_(std::move(kernels)), run_(run) {}

  void operator()(ffi::PackedArgs args, ffi::Any* rv) const {
    const int n_tensors = static_cast<int>(used_.size());
    const int n_args = args.size();
    if (n_ints_ > 0 && n_args != n_tensors + n_values_ + n_ints_) {
      TVM_FFI_THROW(TypeError) << "takes " << n_tensors << " tensors (or None), then " << n_values_
                               << " floats, then " << n_ints_ << " integers; got " << n_args << " arguments";
    }
    if (n_ints_ == 0 && n_args != n_tensors && n_args != n_tensors + n_values_) {
      TVM_FFI_THROW(TypeError) << "takes " << n_tensors << " tensors (or None), then optionally "
                               << n_values_ << " floats; got " << n_args << " arguments";
    }
    uint64_t addresses[kMaxTensors] = {};
    int n_given_tensors = 0;
    for (int i = 0; i < n_tensors; ++i) {
      std::optional<DLTensor*> t = args[i].try_cast<DLTensor*>();
      std::optional<int64_t> address = t.has_value() ? std::nullopt : args[i].try_cast<int64_t>();
      if (address.has_value()) {
        // An operand's address, read and checked (device, alignment) by the caller.
        if (!used_[i]) {
          TVM_FFI_THROW(ValueError) << "argument " << i << " is an address; this launcher was bound "
                                    << "for a request without that operand";
        }
        addresses[i] = static_cast<uint64_t>(*address);
      } else if (t.has_value()) {
        ++n_given_tensors;
        if (!used_[i]) {
          TVM_FFI_THROW(ValueError) << "argument " << i << " is a tensor; this launcher was bound "
                                    << "for a request without that operand";
        }
        const DLTensor* d = *t;
        if (d->device.device_type != device_type_ || d->device.device_id != device_) {
          TVM_FFI_THROW(ValueError) << "argument " << i << " is on device (" << d->device.device_type
                                    << ", " << d->device.device_id << "), the launcher on ("
                                    << device_type_ << ", " << device_ << ")";
        }
        addresses[i] = reinterpret_cast<uint64_t>(d->data) + d->byte_offset;
      } else if (args[i] != nullptr) {
        TVM_FFI_THROW(TypeError) << "argument " << i << " is neither a tensor, an address nor None";
      } else if (used_[i]) {
        TVM_FFI_THROW(ValueError) << "argument " << i << " is None; this launcher was bound for a "
                                  << "request with that operand";
      }
    }
    double values[kMaxValues] = {};
    const bool given = n_args > n_tensors;
    for (int j = 0; given && j < n_values_; ++j) {
      std::optional<double> v = args[n_tensors + j].try_cast<double>();
      if (!v.has_value()) TVM_FFI_THROW(TypeError) << "argument " << n_tensors + j << " is not a float";
      values[j] = *v;
    }
    int64_t ints[kMaxInts] = {};
    const int first_int = n_tensors + n_values_;
    for (int j = 0; j < n_ints_; ++j) {
      std::optional<int64_t> v = args[first_int + j].try_cast<int64_t>();
      if (!v.has_value()) {
        TVM_FFI_THROW(TypeError) << "argument " << first_int + j << " (per-call integer " << j
                                 << ") is not an integer";
      }
      ints[j] = *v;
    }
    // The torch stream current when the call was made: tvm_ffi records it for the device of
    // the first CUDA tensor argument (DLPack exchange API's current_work_stream) around the call.
    if (n_given_tensors == 0) {
      TVM_FFI_THROW(ValueError) << "no argument is a tensor: the current stream is read through one";
    }
    CUstream stream = static_cast<CUstream>(TVMFFIEnvGetStream(device_type_, device_));
    if (run_) ensure_context(device_);
    ffi::Array<ffi::Bytes> packed;
    for (const Kernel& k : kernels_) {
      uint64_t slots[kMaxParams];
      for (size_t i = 0; i < k.params.size(); ++i) {
        const Param& p = k.params[i];
        switch (p.kind) {
          case kPointer:
            slots[i] = addresses[p.index];
            break;
          case kFloat32: {  // (Triton's launcher: the double rounded to float)
            float f = static_cast<float>(values[p.index]);
            uint32_t u;
            std::memcpy(&u, &f, sizeof u);
            slots[i] = given ? u : p.bits;
            break;
          }
          case kFloat64:
            slots[i] = p.bits;
            if (given) std::memcpy(&slots[i], &values[p.index], sizeof(double));
            break;
          case kInt:
          case kUint:
            slots[i] = int_bits(ints[p.index], static_cast<int64_t>(p.bits), p.kind == kUint,
                                static_cast<int>(p.index), first_int + static_cast<int>(p.index));
            break;
          default:
            slots[i] = p.bits;
        }
      }
      if (run_) {
        launch_one(k, slots, stream);
      } else {
        packed.push_back(ffi::Bytes(reinterpret_cast<const char*>(slots), k.params.size() * sizeof(uint64_t)));
      }
    }
    if (!run_) *rv = packed;
  }

 private:
  int device_type_, device_;
  std::vector<bool> used_;
  int n_values_, n_ints_;
  std::vector<Kernel> kernels_;
  bool run_;
};

// spec: per kernel [function, grid, threads per program, shared bytes, cooperative, pdl,
// n_params, (kind, index, bits) per parameter]; `used`: 1 for each tensor argument some
// parameter reads; `n_ints`: the per-call integers each call passes after the floats.
ffi::Function make_launcher(int64_t device_type, int64_t device, ffi::Array<int64_t> used, int64_t n_values,
                            int64_t n_ints, ffi::Array<int64_t> spec, bool run) {
  if (used.size() > kMaxTensors || n_values < 0 || n_values > kMaxValues || n_ints < 0 || n_ints > kMaxInts) {
    TVM_FFI_THROW(ValueError) << "at most " << kMaxTensors << " tensors, " << kMaxValues << " floats and "
                              << kMaxInts << " per-call integers";
  }
  if (run) driver();  // (a missing libcuda is reported here, not on the first call)
  std::vector<bool> used_flags;
  for (int64_t u : used) used_flags.push_back(u != 0);
  std::vector<Kernel> kernels;
  size_t at = 0;
  auto next = [&]() -> int64_t {
    if (at >= spec.size()) TVM_FFI_THROW(ValueError) << "kernel description ends early";
    return spec[at++];
  };
  while (at < spec.size()) {
    Kernel k;
    k.function = reinterpret_cast<CUfunction>(static_cast<uintptr_t>(next()));
    k.grid = static_cast<unsigned>(next());
    k.block = static_cast<unsigned>(next());
    k.shared = static_cast<unsigned>(next());
    k.cooperative = next() != 0;
    k.pdl = next() != 0;
    int64_t n = next();
    if (n > kMaxParams) {
      TVM_FFI_THROW(ValueError) << "a kernel of " << n << " parameters (at most " << kMaxParams << ")";
    }
    for (int64_t i = 0; i < n; ++i) {
      Param p{next(), next(), 0};
      p.bits = static_cast<uint64_t>(next());
      bool bad = (p.kind == kPointer && (p.index < 0 || p.index >= static_cast<int64_t>(used_flags.size()) ||
                                         !used_flags[p.index])) ||
                 ((p.kind == kFloat32 || p.kind == kFloat64) && (p.index < 0 || p.index >= n_values)) ||
                 ((p.kind == kInt || p.kind == kUint) &&
                  (p.index < 0 || p.index >= n_ints || (p.bits != 1 && p.bits != 2 && p.bits != 4 && p.bits != 8))) ||
                 p.kind < kConstant || p.kind > kUint;
      if (bad) TVM_FFI_THROW(ValueError) << "parameter " << i << ": kind " << p.kind << ", index " << p.index;
      k.params.push_back(p);
    }
    kernels.push_back(std::move(k));
  }
  return ffi::Function::FromPacked(Launcher(static_cast<int>(device_type), static_cast<int>(device),
                                            std::move(used_flags), static_cast<int>(n_values),
                                            static_cast<int>(n_ints), std::move(kernels), run));
}

// The stream TVM-FFI holds for `t`'s device during this call (the caller's current stream
// when `t` came from a framework that reports it): checked once against torch's.
int64_t env_stream(ffi::TensorView t) {
  return reinterpret_cast<int64_t>(TVMFFIEnvGetStream(t.device().device_type, t.device().device_id));
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(make_launcher, make_launcher);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(env_stream, env_stream);
