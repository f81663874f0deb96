// The NCCL communicator: one GPU per rank, a non-blocking ncclComm_t
// bootstrapped over the process group (as nccl-tests does over MPI), and one
// non-blocking CUDA stream that every collective is queued on in order.
//
// Non-blocking (config.blocking = 0) because the watchdog must be able to end
// a stuck rank: NCCL's fault-tolerance guide makes every call return at once
// on such a communicator "to ensure ncclCommAbort can be called at any point,
// during initialization, communication or when finalizing". The price is
// that calls may return ncclInProgress: the call was accepted and NCCL is
// still enqueuing it in the background; until ncclCommGetAsyncError says
// ncclSuccess, neither another NCCL call nor CUDA work on the stream is
// allowed (NCCL API reference, ncclCommGetAsyncError).
//
// NCCL calls are not thread-safe ("only one thread operates the communicator
// at a time", NCCL user guide, Thread Safety) and ncclCommAbort frees the
// communicator, so every NCCL call on it, including the watchdog's abort,
// holds mu_. None of them blocks for long on a non-blocking communicator.
#include "kernels/cuda/nccl_comm.hpp"

#include <algorithm>  // std::min
#include <atomic>     // std::atomic
#include <chrono>     // std::chrono::steady_clock, durations
#include <cstdint>    // std::int64_t
#include <cstdlib>    // std::getenv, std::strtol
#include <cstring>    // std::memcpy
#include <mutex>      // std::mutex, std::unique_lock, std::lock_guard
#include <string>     // std::string
#include <thread>     // std::this_thread::sleep_for
#include <vector>     // std::vector

#include <cuda_runtime.h>  // cudaGetDeviceCount, cudaMalloc, cudaMemcpy, cudaStream*, cudaEvent*
#include <fmt/format.h>    // fmt::format
#include <nccl.h>          // ncclComm_t, ncclConfig_t, collectives, ncclCommGetAsyncError

#include "harness/errors.hpp"                  // Error, HangError, UnsupportedError, throw_call_failure
#include "kernels/cuda/detail/check.hpp"       // SB_CUDA_CHECK, cuda_kind, cuda_name
#include "kernels/cuda/detail/nccl_check.hpp"  // SB_NCCL_CHECK, SB_NCCL_CHECK_NONBLOCKING, nccl_name

namespace sb {
namespace {

using namespace std::chrono_literals;
using std::chrono::steady_clock;

// NCCL 2.30 added NCCL_MULTI_RANK_GPU_ENABLE; before it, two ranks of one
// communicator on one GPU fail init with "Duplicate GPU detected".
constexpr int kMultiRankGpuVersion = NCCL_VERSION(2, 30, 0);

// start() has no deadline of its own. It waits only when a previous call is
// still being enqueued, which takes long only while NCCL connects peers for
// the first call of a kind and a peer is missing; the watchdog's abort()
// ends that wait sooner.
constexpr auto kEnqueueTimeout = 60s;
// The destructor's ncclCommFinalize synchronizes with the other ranks; past
// this a peer is gone or stuck, and the communicator is aborted instead.
constexpr auto kFinalizeTimeout = 10s;

// Short naps first so a quick state change is seen within microseconds, then
// 1 ms so a long wait costs no CPU worth measuring.
class Backoff {
 public:
  void nap() {
    std::this_thread::sleep_for(nap_);
    nap_ = std::min<std::chrono::microseconds>(nap_ * 2, 1ms);
  }

 private:
  std::chrono::microseconds nap_{20};
};

int nccl_version_code() {
  int v = 0;
  return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

// NCCL_VERSION's two encodings: X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z from 2.9.
std::string nccl_version_string(int v) {
  if (v < 10000) return fmt::format("{}.{}.{}", v / 1000, (v % 1000) / 100, v % 100);
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

// NCCL reads its integer parameters with strtoll: any non-zero number enables.
bool env_enabled(const char* name) {
  const char* s = std::getenv(name);
  return s != nullptr && *s != '\0' && std::strtol(s, nullptr, 0) != 0;
}

// NCCL lets NCCL_COMM_BLOCKING override config.blocking (envConfigOverride
// in its init.cc). A blocking communicator would sit inside a collective
// holding mu_, and the watchdog's abort() could never get in.
bool env_forces_blocking() {
  const char* s = std::getenv("NCCL_COMM_BLOCKING");
  return s != nullptr && *s != '\0' && std::strtol(s, nullptr, 0) == 1;
}

// This rank's GPU, or why it has none.
struct DeviceChoice {
  int device = -1;
  std::string why_not;
};

DeviceChoice choose_device(const ProcessGroup& group, int version) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // handled here: keep it out of later launch checks
    return {-1, fmt::format("backend=nccl needs a CUDA GPU, but cudaGetDeviceCount failed on host {}: {} ({})",
                            group.host(), cudaGetErrorName(e), cudaGetErrorString(e))};
  }
  if (count == 0) return {-1, fmt::format("backend=nccl needs a CUDA GPU, but host {} has none visible", group.host())};
  if (count >= group.local_size()) return {group.local_rank(), {}};
  if (version >= kMultiRankGpuVersion && env_enabled("NCCL_MULTI_RANK_GPU_ENABLE"))
    return {group.local_rank() % count, {}};
  std::string why = fmt::format("backend=nccl needs one GPU per rank: {} ranks on host {} but only {} GPU(s) visible",
                                group.local_size(), group.host(), count);
  if (version < kMultiRankGpuVersion)
    why += fmt::format("; NCCL {} (before 2.30) refuses two ranks on one GPU (\"Duplicate GPU detected\")",
                       nccl_version_string(version));
  else
    why += "; NCCL 2.30+ can share a GPU between ranks (experimental) with NCCL_MULTI_RANK_GPU_ENABLE=1";
  return {-1, why};
}

ncclDataType_t nccl_type(CommDtype d) {
  switch (d) {
    case CommDtype::fp32: return ncclFloat32;
    case CommDtype::fp64: return ncclFloat64;
    case CommDtype::bf16: return ncclBfloat16;
    case CommDtype::i64: return ncclInt64;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp r) { return r == ReduceOp::sum ? ncclSum : ncclMax; }

// All-to-all as nccl-tests builds it: one send and one receive of `per`
// elements with every peer (itself included) in a single group, so NCCL
// matches them without deadlock. A call refused inside the group leaves the
// group open; ncclGroupEnd then returns that error and launches nothing.
ncclResult_t all_to_all(const void* send, void* recv, std::size_t per, ncclDataType_t t, std::size_t elem,
                        int nranks, ncclComm_t comm, cudaStream_t stream) {
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return r;
  const std::size_t chunk = per * elem;
  for (int peer = 0; peer < nranks; ++peer) {
    const std::size_t off = static_cast<std::size_t>(peer) * chunk;
    r = ncclSend(static_cast<const char*>(send) + off, per, t, peer, comm, stream);
    if (!cuda_detail::nccl_accepted(r)) break;
    r = ncclRecv(static_cast<char*>(recv) + off, per, t, peer, comm, stream);
    if (!cuda_detail::nccl_accepted(r)) break;
  }
  if (!cuda_detail::nccl_accepted(r)) {
    (void)ncclGroupEnd();
    return r;
  }
  return ncclGroupEnd();  // may be ncclInProgress: enqueuing goes on in the background
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ProcessGroup& group, ProcessGroup::Deadline deadline)
      : rank_(group.rank()), size_(group.size()) {
    const int version = nccl_version_code();
    library_ = "NCCL " + nccl_version_string(version);

    // Agree first, so that a rank without a GPU makes every rank fail now
    // rather than leave the others waiting in the id broadcast.
    DeviceChoice choice = choose_device(group, version);
    if (choice.device >= 0 && env_forces_blocking())
      choice = {-1, "backend=nccl runs a non-blocking communicator so that the watchdog can abort it, but "
                    "NCCL_COMM_BLOCKING=1 in the environment would make it blocking: unset it"};
    const std::vector<std::int64_t> ok = group.allgather(std::int64_t{choice.device >= 0}, deadline);
    if (choice.device < 0) throw UnsupportedError(choice.why_not);
    std::string missing;
    for (std::size_t r = 0; r < ok.size(); ++r)
      if (ok[r] == 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    if (!missing.empty())
      throw UnsupportedError(fmt::format("backend=nccl: rank(s) {} cannot run it (their own messages say why)",
                                         missing));
    device_ = choice.device;
    bind();

    ncclUniqueId id{};
    open_unique_id(group, deadline, id);

    try {
      SB_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      // Markers only: timing is taken by the scenario on the host.
      SB_CUDA_CHECK(cudaEventCreateWithFlags(&start_event_, cudaEventDisableTiming));
      SB_CUDA_CHECK(cudaEventCreateWithFlags(&done_event_, cudaEventDisableTiming));

      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;  // see the top of this file
      SB_NCCL_CHECK_NONBLOCKING(comm_, ncclCommInitRankConfig(&comm_, size_, id, rank_, &config));
      wait_for_init(deadline);
    } catch (...) {
      release();
      throw;
    }
  }

  ~NcclCommunicator() override {
    (void)cudaSetDevice(device_);
    {
      const std::lock_guard<std::mutex> lock(mu_);
      if (comm_ != nullptr && !aborted_.exchange(true)) close_comm();
      comm_ = nullptr;
    }
    release();
  }

  std::string backend() const override { return "nccl"; }
  std::string device() const override { return fmt::format("cuda:{}", device_); }
  std::string library() const override { return library_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool queues_in_order() const override { return true; }

  void* alloc(std::size_t bytes) override {
    bind();
    void* p = nullptr;
    const cudaError_t s = cudaMalloc(&p, bytes);
    if (s != cudaSuccess) {
      (void)cudaGetLastError();  // handled here: keep it out of later launch checks
      throw_call_failure(cuda_detail::cuda_kind(s), "CUDA", "cudaMalloc(&p, bytes)", cuda_detail::cuda_name(s),
                         __FILE__, __LINE__);
    }
    buffers_.push_back(p);
    return p;
  }

  // cudaMemcpy runs on the legacy default stream, which does not wait for
  // stream_ (non-blocking): callers upload and download only while no call is
  // pending. A pageable host-to-device cudaMemcpy may return before its DMA
  // lands, so the upload also waits for the legacy stream, where the copy
  // runs, before the next collective on stream_ can read the buffer.
  void upload(void* dst, const void* host, std::size_t bytes) override {
    bind();
    SB_CUDA_CHECK(cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice));
    SB_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  }
  void download(void* host, const void* src, std::size_t bytes) override {
    bind();
    SB_CUDA_CHECK(cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost));
  }

  void start(const CollCall& c, const void* send, void* recv) override {
    bind();
    std::unique_lock<std::mutex> lock(mu_);
    wait_enqueued(lock, c.op);
    // A new oldest pending call gets a fresh "started" marker; while calls
    // are pending the marker of the oldest one stays.
    if (pending_ && query("cudaEventQuery(done_event_)", cudaEventQuery(done_event_))) pending_ = false;
    if (!pending_) SB_CUDA_CHECK(cudaEventRecord(start_event_, stream_));

    const ncclDataType_t t = nccl_type(c.dtype);
    const ncclRedOp_t op = nccl_op(c.reduce);
    const CollCounts n = coll_counts(c, size_);
    const auto count = static_cast<std::size_t>(c.count);
    // ncclSuccess: enqueued on stream_. ncclInProgress: accepted, NCCL is
    // still enqueuing it; the "done" marker must wait until it has finished
    // (finish_enqueue), and poll() reports the call pending or started
    // meanwhile.
    ncclResult_t r = ncclSuccess;
    switch (c.op) {
      case CollOp::all_reduce:
        SB_NCCL_CHECK_NONBLOCKING(comm_, r = ncclAllReduce(send, recv, count, t, op, comm_, stream_));
        break;
      case CollOp::all_gather:
        SB_NCCL_CHECK_NONBLOCKING(
            comm_, r = ncclAllGather(send, recv, static_cast<std::size_t>(n.send), t, comm_, stream_));
        break;
      case CollOp::reduce_scatter:
        SB_NCCL_CHECK_NONBLOCKING(
            comm_, r = ncclReduceScatter(send, recv, static_cast<std::size_t>(n.recv), t, op, comm_, stream_));
        break;
      case CollOp::broadcast:
        SB_NCCL_CHECK_NONBLOCKING(comm_, r = ncclBroadcast(send, recv, count, t, c.root, comm_, stream_));
        break;
      case CollOp::reduce:
        SB_NCCL_CHECK_NONBLOCKING(comm_, r = ncclReduce(send, recv, count, t, op, c.root, comm_, stream_));
        break;
      case CollOp::all_to_all:
        SB_NCCL_CHECK_NONBLOCKING(comm_, r = all_to_all(send, recv, count / static_cast<std::size_t>(size_), t,
                                                        dtype_size(c.dtype), size_, comm_, stream_));
        break;
    }
    pending_ = true;
    if (r == ncclInProgress) enqueuing_ = true;
    else SB_CUDA_CHECK(cudaEventRecord(done_event_, stream_));
  }

  Progress poll() override {
    bind();
    const std::lock_guard<std::mutex> lock(mu_);
    const ncclResult_t state = async_state("collective");  // throws on an asynchronous error
    if (enqueuing_) {
      if (state == ncclInProgress) return started_or_pending();
      SB_CUDA_CHECK(cudaEventRecord(done_event_, stream_));
      enqueuing_ = false;
    }
    if (!pending_) return Progress::done;
    if (query("cudaEventQuery(done_event_)", cudaEventQuery(done_event_))) {
      pending_ = false;
      return Progress::done;
    }
    return started_or_pending();
  }

  // ncclCommAbort stops the communicator's kernels and frees it. It is meant
  // for a non-blocking communicator at any point of its life (NCCL user
  // guide, Fault Tolerance); mu_ keeps it from overlapping a call of the
  // polling thread, and the flag makes it happen once.
  void abort() noexcept override {
    if (aborted_.exchange(true)) return;
    try {
      const std::lock_guard<std::mutex> lock(mu_);
      if (comm_ != nullptr) {
        (void)cudaSetDevice(device_);  // the watchdog's thread may have another device current
        (void)ncclCommAbort(comm_);
        comm_ = nullptr;
      }
    } catch (...) {
      // std::mutex::lock can throw std::system_error; nothing more to do here
    }
  }

 private:
  void bind() const { SB_CUDA_CHECK(cudaSetDevice(device_)); }

  // cudaSuccess: true; cudaErrorNotReady: false; anything else throws.
  static bool query(const char* call, cudaError_t s) {
    if (s == cudaSuccess) return true;
    if (s == cudaErrorNotReady) return false;
    throw_call_failure(cuda_detail::cuda_kind(s), "CUDA", call, cuda_detail::cuda_name(s), __FILE__, __LINE__);
  }

  Progress started_or_pending() const {
    return query("cudaEventQuery(start_event_)", cudaEventQuery(start_event_)) ? Progress::started
                                                                               : Progress::pending;
  }

  // Rank 0 makes the id; the process group carries its bytes to every rank.
  // A rank 0 that cannot make one sends nothing, so the others fail at once.
  void open_unique_id(ProcessGroup& group, ProcessGroup::Deadline deadline, ncclUniqueId& id) {
    std::string bytes;
    ncclResult_t made = ncclSuccess;
    if (rank_ == 0) {
      made = ncclGetUniqueId(&id);
      if (made == ncclSuccess) bytes.assign(id.internal, sizeof id.internal);
    }
    bytes = group.broadcast(bytes, 0, deadline);
    SB_NCCL_CHECK(made);
    if (bytes.size() != sizeof id.internal)
      throw Error(ErrorKind::runtime,
                  fmt::format("backend=nccl: rank 0 sent a unique id of {} bytes, not {} (ncclGetUniqueId failed "
                              "there; its message says why)",
                              bytes.size(), sizeof id.internal));
    std::memcpy(id.internal, bytes.data(), sizeof id.internal);
  }

  // The communicator's state; an asynchronous error is fatal to it (NCCL
  // user guide, Error handling and communicator abort).
  ncclResult_t async_state(const char* step) {
    if (comm_ == nullptr)
      throw Error(ErrorKind::runtime,
                  fmt::format("NCCL {} on cuda:{}: the communicator was aborted (ncclCommAbort)", step, device_));
    ncclResult_t state = ncclSuccess;
    SB_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
    if (state != ncclSuccess && state != ncclInProgress)
      throw Error(ErrorKind::runtime, fmt::format("NCCL {} on cuda:{} failed: ncclCommGetAsyncError -> {}", step,
                                                  device_, cuda_detail::NcclNameOn{comm_}(state)));
    return state;
  }

  // Init runs in NCCL's background thread and needs every rank: past the
  // deadline a rank did not join (or is stuck), and the half-made
  // communicator is aborted so this process can report and end.
  void wait_for_init(ProcessGroup::Deadline deadline) {
    Backoff backoff;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      SB_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress)
        throw Error(ErrorKind::runtime,
                    fmt::format("NCCL init (ncclCommInitRankConfig) of rank {} of {} on cuda:{} failed: {}", rank_,
                                size_, device_, cuda_detail::NcclNameOn{comm_}(state)));
      if (steady_clock::now() >= deadline)
        throw HangError(fmt::format("NCCL init (ncclCommInitRankConfig) of rank {} of {} on cuda:{} did not "
                                    "complete before its deadline (a rank did not join, or is stuck)",
                                    rank_, size_, device_));
      backoff.nap();
    }
  }

  // Ends an enqueue still in the background, if any: records the "done"
  // marker that had to wait for it. Returns false while it goes on.
  bool finish_enqueue(const char* step) {
    if (!enqueuing_) return true;
    if (async_state(step) == ncclInProgress) return false;
    SB_CUDA_CHECK(cudaEventRecord(done_event_, stream_));
    enqueuing_ = false;
    return true;
  }

  // NCCL allows no call while the previous one is in progress. Naps with mu_
  // released, so the watchdog's abort() can get in.
  void wait_enqueued(std::unique_lock<std::mutex>& lock, CollOp next) {
    const std::string step = fmt::format("{} (waiting for the previous call to be enqueued)", to_string(next));
    if (comm_ == nullptr) (void)async_state(step.c_str());  // throws: aborted
    const auto deadline = steady_clock::now() + kEnqueueTimeout;
    Backoff backoff;
    while (!finish_enqueue(step.c_str())) {
      if (steady_clock::now() >= deadline)
        throw HangError(fmt::format("NCCL on cuda:{}: the previous call was not enqueued within {} s before {} "
                                    "(ncclCommGetAsyncError stayed ncclInProgress; a peer may not have called it)",
                                    device_, std::chrono::duration_cast<std::chrono::seconds>(kEnqueueTimeout).count(),
                                    to_string(next)));
      lock.unlock();
      backoff.nap();
      lock.lock();
    }
  }

  // Finalize (flushes pending work, synchronizes with the peers), then
  // destroy; a finalize that fails or does not end in time is an abort
  // instead. Under mu_; never throws.
  void close_comm() noexcept {
    bool clean = false;
    if (cuda_detail::nccl_accepted(ncclCommFinalize(comm_))) {
      const auto deadline = steady_clock::now() + kFinalizeTimeout;
      Backoff backoff;
      for (;;) {
        ncclResult_t state = ncclSuccess;
        if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
        if (state != ncclInProgress) {
          clean = state == ncclSuccess;
          break;
        }
        if (steady_clock::now() >= deadline) break;
        backoff.nap();
      }
    }
    // Destroy after a finalize that reached ncclSuccess does not block (NCCL
    // user guide, Destroying a communicator).
    if (clean) (void)ncclCommDestroy(comm_);
    else (void)ncclCommAbort(comm_);
  }

  // Everything but the communicator; never throws. Buffers go first: their
  // cudaFree waits for the device, which by now runs nothing of ours.
  void release() noexcept {
    if (comm_ != nullptr) {  // only after a failed constructor
      (void)ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    for (void* p : buffers_) (void)cudaFree(p);
    buffers_.clear();
    if (done_event_ != nullptr) (void)cudaEventDestroy(done_event_);
    if (start_event_ != nullptr) (void)cudaEventDestroy(start_event_);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    done_event_ = start_event_ = nullptr;
    stream_ = nullptr;
  }

  const int rank_, size_;
  int device_ = 0;
  std::string library_;

  std::mutex mu_;                    // held around every NCCL call on comm_
  ncclComm_t comm_ = nullptr;        // null once aborted
  std::atomic<bool> aborted_{false};  // abort() (or the destructor) has claimed comm_

  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_event_ = nullptr;  // recorded before the oldest pending call
  cudaEvent_t done_event_ = nullptr;   // recorded after the newest call once it is enqueued
  bool pending_ = false;               // calls started and not yet seen done
  bool enqueuing_ = false;             // the newest call returned ncclInProgress and is not enqueued yet
  std::vector<void*> buffers_;
};

}  // namespace

std::unique_ptr<Communicator> open_nccl_communicator(ProcessGroup& group, ProcessGroup::Deadline deadline) {
  return std::make_unique<NcclCommunicator>(group, deadline);
}

}  // namespace sb
