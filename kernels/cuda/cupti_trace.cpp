// CUPTI's activity records into a Kineto trace (what and why in
// cupti_trace.hpp). Kineto's own CUPTI reader names the events the same way:
// kernels by their demangled name, copies "Memcpy HtoD (Pageable -> Device)",
// memsets "Memset (Device)", runtime calls without CUPTI's "_v7000" suffix.
#include "kernels/cuda/cupti_trace.hpp"

#include <dlfcn.h>  // dlopen, dlsym

#include <cstdlib>  // std::aligned_alloc, std::free
#include <mutex>    // std::mutex

#include <cupti_activity.h>   // CUpti_Activity* records (header only: libcupti is dlopen'ed)
#include <cupti_callbacks.h>  // CUPTI_CB_DOMAIN_RUNTIME_API
#include <fmt/format.h>       // fmt::format

#include "harness/kineto_trace.hpp"  // KinetoTrace

namespace sb {

struct CuptiTrace::Impl {
  void* lib = nullptr;
  KinetoTrace* trace = nullptr;
  double offset_us = 0;  // the trace's clock minus CUPTI's, in µs
  CUptiResult (*enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*disable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*flush_all)(uint32_t) = nullptr;
  CUptiResult (*next_record)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
  CUptiResult (*timestamp)(uint64_t*) = nullptr;
  CUptiResult (*result_string)(CUptiResult, const char**) = nullptr;
  CUptiResult (*callback_name)(CUpti_CallbackDomain, uint32_t, const char**) = nullptr;
};

namespace {

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_RUNTIME};
constexpr std::size_t kBufferBytes = std::size_t(8) << 20;

// CUPTI's buffer callbacks carry no user data: one tracer at a time.
std::mutex g_mu;
CuptiTrace::Impl* g_active = nullptr;

const char* memory_kind(uint8_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE: return "Pageable";
    case CUPTI_ACTIVITY_MEMORY_KIND_PINNED: return "Pinned";
    case CUPTI_ACTIVITY_MEMORY_KIND_DEVICE: return "Device";
    default: return "Unknown";
  }
}
const char* copy_kind(uint8_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "HtoH";
    default: return "Other";
  }
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard lk(g_mu);
  CuptiTrace::Impl* im = g_active;
  if (im && buffer) {
    KinetoTrace& t = *im->trace;
    auto us = [im](uint64_t ns) { return double(ns) / 1e3 + im->offset_us; };
    CUpti_Activity* rec = nullptr;
    while (im->next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
      switch (rec->kind) {
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
        case CUPTI_ACTIVITY_KIND_KERNEL: {
          const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
          t.device(KinetoTrace::Kind::kernel, k->name ? k->name : "kernel", us(k->start), double(k->end - k->start) / 1e3,
                   k->correlationId, -1, k->streamId, k->deviceId);
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
          t.device(KinetoTrace::Kind::memcpy,
                   fmt::format("Memcpy {} ({} -> {})", copy_kind(m->copyKind), memory_kind(m->srcKind),
                               memory_kind(m->dstKind)),
                   us(m->start), double(m->end - m->start) / 1e3, m->correlationId, std::int64_t(m->bytes), m->streamId,
                   m->deviceId);
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
          t.device(KinetoTrace::Kind::memset, "Memset (Device)", us(m->start), double(m->end - m->start) / 1e3,
                   m->correlationId, std::int64_t(m->bytes), m->streamId, m->deviceId);
          break;
        }
        case CUPTI_ACTIVITY_KIND_RUNTIME: {
          const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(rec);
          const char* name = nullptr;
          std::string n = im->callback_name && im->callback_name(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name) ==
                                                       CUPTI_SUCCESS && name
                              ? name
                              : fmt::format("cuda runtime call {}", a->cbid);
          if (const auto v = n.rfind("_v"); v != std::string::npos && v + 2 < n.size() &&
                                            n.find_first_not_of("0123456789", v + 2) == std::string::npos)
            n.resize(v);  // cudaLaunchKernel_v7000 -> cudaLaunchKernel
          t.host_on(KinetoTrace::Kind::runtime, std::move(n), us(a->start), double(a->end - a->start) / 1e3,
                    a->threadId, a->correlationId);
          break;
        }
        default:
          break;
      }
    }
  }
  std::free(buffer);
}

}  // namespace

CuptiTrace::CuptiTrace(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<CuptiTrace> CuptiTrace::start(KinetoTrace& t, std::string& why) {
  auto im = std::make_unique<Impl>();
  for (const char* name : {"libcupti.so.13", "libcupti.so.12", "libcupti.so"}) {
    im->lib = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (im->lib) break;
  }
  if (!im->lib) {
    const char* e = ::dlerror();
    why = fmt::format("libcupti not found ({}): kernel events need CUPTI (the CUDA toolkit's lib64, or the "
                      "nvidia-cuda-cupti wheel on LD_LIBRARY_PATH)",
                      e ? e : "dlopen failed");
    return nullptr;
  }
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(im->lib, name));
    return fn != nullptr;
  };
  if (!sym(im->enable, "cuptiActivityEnable") || !sym(im->disable, "cuptiActivityDisable") ||
      !sym(im->register_callbacks, "cuptiActivityRegisterCallbacks") || !sym(im->flush_all, "cuptiActivityFlushAll") ||
      !sym(im->next_record, "cuptiActivityGetNextRecord") || !sym(im->timestamp, "cuptiGetTimestamp") ||
      !sym(im->result_string, "cuptiGetResultString")) {
    why = "libcupti lacks the activity API";
    ::dlclose(im->lib);
    return nullptr;
  }
  sym(im->callback_name, "cuptiGetCallbackName");  // optional: names the runtime calls
  im->trace = &t;
  auto fail = [&](const char* call, CUptiResult r) {
    const char* s = nullptr;
    im->result_string(r, &s);
    why = fmt::format("{} failed: {}", call, s ? s : "unknown CUPTI error");
  };
  {
    std::lock_guard lk(g_mu);
    if (g_active) {
      why = "another CUPTI trace is running in this process";
      ::dlclose(im->lib);
      return nullptr;
    }
    g_active = im.get();
  }
  uint64_t ns = 0;
  im->timestamp(&ns);
  im->offset_us = t.now_us() - double(ns) / 1e3;
  CUptiResult r = im->register_callbacks(buffer_requested, buffer_completed);
  if (r != CUPTI_SUCCESS) {
    fail("cuptiActivityRegisterCallbacks", r);
    std::lock_guard lk(g_mu);
    g_active = nullptr;
    return nullptr;
  }
  for (CUpti_ActivityKind k : kKinds)
    if ((r = im->enable(k)) != CUPTI_SUCCESS) {
      fail("cuptiActivityEnable", r);
      for (CUpti_ActivityKind d : kKinds) im->disable(d);
      std::lock_guard lk(g_mu);
      g_active = nullptr;
      return nullptr;
    }
  return std::unique_ptr<CuptiTrace>(new CuptiTrace(std::move(im)));
}

CuptiTrace::~CuptiTrace() {
  impl_->flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);  // buffer_completed writes them into the trace
  for (CUpti_ActivityKind k : kKinds) impl_->disable(k);
  impl_->flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard lk(g_mu);
  g_active = nullptr;
  // libcupti stays loaded: CUPTI keeps threads and callbacks inside it for the process's life
}

}  // namespace sb
