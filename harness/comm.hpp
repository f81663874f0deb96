// Collectives across ranks: the process group a launcher started (mpirun,
// srun) and the communicators the `collective` scenario drives (MPI on host
// buffers, NCCL on one GPU per rank). Scenarios talk only to this header; no
// MPI or NCCL header is included here.
#pragma once

#include <chrono>    // std::chrono::steady_clock
#include <cstddef>   // std::size_t
#include <cstdint>   // std::int64_t
#include <memory>    // std::unique_ptr
#include <optional>  // std::optional
#include <string>    // std::string
#include <vector>    // std::vector
#include "harness/names.hpp"  // NameTable: to_string, parse and choices from one table

namespace sb {

enum class CollOp { all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all };
enum class CommDtype { fp32, fp64, bf16, i64 };  // i64: the fingerprint check's own all-reduce
enum class ReduceOp { sum, max };

inline constexpr NameTable<CollOp, 6> kCollOpNames{{{{CollOp::all_reduce, "all_reduce"}, {CollOp::broadcast, "broadcast"}, {CollOp::reduce, "reduce"}, {CollOp::all_gather, "all_gather"}, {CollOp::reduce_scatter, "reduce_scatter"}, {CollOp::all_to_all, "all_to_all"}}}};
inline std::string_view to_string(CollOp v) { return kCollOpNames.name(v); }
inline constexpr NameTable<CommDtype, 4> kCommDtypeNames{{{{CommDtype::fp32, "fp32"}, {CommDtype::fp64, "fp64"}, {CommDtype::bf16, "bf16"}, {CommDtype::i64, "i64"}}}};
inline std::string_view to_string(CommDtype v) { return kCommDtypeNames.name(v); }
inline constexpr NameTable<ReduceOp, 2> kReduceOpNames{{{{ReduceOp::sum, "sum"}, {ReduceOp::max, "max"}}}};
inline std::string_view to_string(ReduceOp v) { return kReduceOpNames.name(v); }
inline std::optional<CollOp> parse_coll_op(std::string_view s) { return kCollOpNames.parse(s); }
inline std::optional<CommDtype> parse_comm_dtype(std::string_view s) { return kCommDtypeNames.parse(s); }
inline std::optional<ReduceOp> parse_reduce_op(std::string_view s) { return kReduceOpNames.parse(s); }
const std::vector<CollOp>& all_coll_ops();
std::size_t dtype_size(CommDtype);
bool is_rooted(CollOp op);  // broadcast, reduce
bool reduces(CollOp op);    // all_reduce, reduce, reduce_scatter

// One collective call as a rank issued it.
struct CollCall {
  CollOp op = CollOp::all_reduce;
  // nccl-tests' "count": elements of the larger of the two buffers (all-gather:
  // the gathered output; reduce-scatter and all-to-all: the whole input).
  std::int64_t count = 0;
  CommDtype dtype = CommDtype::fp32;
  int root = 0;  // broadcast and reduce only
  ReduceOp reduce = ReduceOp::sum;
  bool operator==(const CollCall&) const = default;
};

// "all_reduce count=1024 fp32 sum", "broadcast count=256 fp32 root=0": a
// call as messages, dumps' analyses and reports name it.
std::string describe(const CollCall& c);

// Elements each rank sends and receives for a call on n ranks (nccl-tests'
// conventions). count must be a multiple of n for all-gather, reduce-scatter
// and all-to-all; round_count() makes it so.
struct CollCounts {
  std::int64_t send = 0;
  std::int64_t recv = 0;
};
CollCounts coll_counts(const CollCall& c, int nranks);
std::int64_t round_count(CollOp op, std::int64_t count, int nranks);

// busbw = algbw × bus_factor (nccl-tests, doc/PERFORMANCE.md): the factor that
// makes a collective's bandwidth comparable with the hardware's link speed.
//   all-reduce 2(n−1)/n: a ring moves each byte n−1 times reducing, n−1 times sharing;
//   all-gather, reduce-scatter, all-to-all (n−1)/n: each rank gets n−1 of n slices;
//   broadcast, reduce 1: every byte crosses one link once.
// One rank has no bus: 0 for n = 1.
double bus_factor(CollOp op, int nranks);

// The process group the job was launched with: over MPI (mpirun, srun), or over TCP for an env://
// launch (torchrun: kernels/tcp/env_group.hpp). It is the control
// plane: a communicator of its own, never the one the workload mismatches,
// used to agree on a run id, gather per-rank figures and bootstrap NCCL.
// Every wait in it has a deadline (HangError when passed).
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;  // rank among the ranks on this host
  virtual int local_size() const = 0;
  virtual std::string launcher() const = 0;  // "mpirun", "srun", "single process"
  virtual std::string host() const = 0;
  virtual std::string library() const = 0;  // "Open MPI v4.1.4, ...", "TCP rendezvous at host:port ..."
  // True when MPI started the ranks (MPI_Init ran): backend=mpi needs it.
  virtual bool is_mpi() const { return false; }

  using Deadline = std::chrono::steady_clock::time_point;
  virtual void barrier(Deadline) = 0;
  // Every rank's value, indexed by rank.
  virtual std::vector<double> allgather(double v, Deadline) = 0;
  virtual std::vector<std::int64_t> allgather(std::int64_t v, Deadline) = 0;
  // Root's bytes on every rank.
  virtual std::string broadcast(const std::string& bytes, int root, Deadline) = 0;
  // Every rank's bytes, on root only (others get an empty vector).
  virtual std::vector<std::string> gather(const std::string& bytes, int root, Deadline) = 0;
  // Ends every rank of the job with this exit code (MPI_Abort). Safe from any thread.
  [[noreturn]] virtual void abort(int code) noexcept = 0;
};

// The group of one process, for a build without MPI (the GPU machine has
// none): a collective on one rank still runs NCCL's init, every op and the
// exact check, though one rank has no bus bandwidth. abort() is _exit.
std::unique_ptr<ProcessGroup> make_single_process_group();

// One communicator of a backend, over the process group's ranks. A call is
// started without waiting and polled to completion; a communicator whose
// calls queue in order (NCCL on a stream) may have several in flight.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string backend() const = 0;  // "mpi", "nccl"
  virtual std::string device() const = 0;   // "host", "cuda:1"
  virtual std::string library() const = 0;  // "NCCL 2.28.3", "Open MPI v4.1.4"
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // true: start() may be called again before the previous call completes.
  virtual bool queues_in_order() const = 0;

  // Memory the backend's collectives use (host or device), freed with the
  // communicator. Throws OutOfMemory.
  virtual void* alloc(std::size_t bytes) = 0;
  virtual void upload(void* dst, const void* host, std::size_t bytes) = 0;
  virtual void download(void* host, const void* src, std::size_t bytes) = 0;

  enum class Progress { pending, started, done };
  // Starts a call on send/recv (sized by coll_counts). Throws Error(runtime)
  // when the library refuses it at once. Several calls may be in flight, as
  // a training step issues its collectives asynchronously: on distinct
  // buffers for MPI (queues_in_order() false), on any for NCCL (a stream).
  virtual void start(const CollCall& c, const void* send, void* recv) = 0;
  // Of the calls started since poll() last said done, how many have
  // completed, counted from the first; -1 when the backend cannot tell
  // (then done is all it says).
  virtual std::int64_t completed_in_order() const { return -1; }
  // Where the oldest call not yet seen done stands, without blocking; done
  // means every started call completed. Throws Error(runtime) naming the
  // library's error (MPI error class, ncclCommGetAsyncError).
  virtual Progress poll() = 0;
  // A blocking call, as users issue them (MPI_Allreduce...): returns when
  // this rank's part is done, or throws Error(runtime) naming the library's
  // error (as poll() does). Only where supports_blocking() is true; there it
  // is what the sweep times, since a library's blocking and nonblocking
  // paths can be different algorithms (Open MPI 4.1: coll/tuned against
  // coll/libnbc). No deadline of its own: a call that never returns is the
  // collective watchdog's to catch (it ends the job from its thread).
  // NCCL has none: its enqueue on a stream is already what users call.
  virtual bool supports_blocking() const { return false; }
  virtual void run_blocking(const CollCall& c, const void* send, void* recv);
  // Makes pending calls return or fail so the process can end: ncclCommAbort.
  // Safe from another thread (the watchdog's). MPI has no per-communicator
  // abort; there the process group's abort ends the job.
  virtual void abort() noexcept = 0;
};

}  // namespace sb
