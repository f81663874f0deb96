#include "kernels/mpi/mpi_comm.hpp"

#include <mpi.h>  // MPI_*

#include <unistd.h>  // _exit, gethostname

#include <cstdlib>  // std::getenv, std::free
#include <cstring>  // std::memcpy
#include <thread>   // std::this_thread::yield
#include <vector>   // std::vector

#include <fmt/format.h>  // fmt::format

#include "harness/dtype.hpp"   // float_to_bf16_bits, bf16_bits_to_float
#include "harness/errors.hpp"  // SB_CHECK_CALL, HangError, UnsupportedError

namespace sb {
namespace {

bool mpi_ok(int rc) { return rc == MPI_SUCCESS; }
ErrorKind mpi_kind(int rc) {
  int cls = 0;
  MPI_Error_class(rc, &cls);
  return cls == MPI_ERR_NO_MEM ? ErrorKind::oom : ErrorKind::runtime;
}
std::string mpi_name(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", rc);
  return std::string(text, static_cast<std::size_t>(len));
}
#define SB_MPI_CHECK(expr) SB_CHECK_CALL("MPI", expr, mpi_ok, mpi_kind, mpi_name)

std::string mpi_library() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(text, &len);
  std::string s(text, static_cast<std::size_t>(len));
  if (const auto comma = s.find(','); comma != std::string::npos) s.resize(comma);  // "Open MPI v4.1.4"
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// Waits for one request with a deadline; the control plane's only wait.
void wait_request(MPI_Request& req, ProcessGroup::Deadline deadline, const char* what) {
  int flag = 0;
  for (int spins = 0;; ++spins) {
    SB_MPI_CHECK(MPI_Test(&req, &flag, MPI_STATUS_IGNORE));
    if (flag) return;
    if (std::chrono::steady_clock::now() > deadline)
      throw HangError(fmt::format("MPI {} on the control communicator passed its deadline "
                                  "(a rank is not answering)", what));
    if (spins < 1000) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

class MpiProcessGroup final : public ProcessGroup {
 public:
  MpiProcessGroup(int* argc, char*** argv) {
    int provided = 0;
    SB_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
    if (provided < MPI_THREAD_MULTIPLE) {
      MPI_Finalize();
      throw UnsupportedError(fmt::format(
          "the MPI library gives thread level {} but the collective watchdog needs MPI_THREAD_MULTIPLE "
          "(it calls MPI_Abort from its own thread)", provided));
    }
    // Errors on the control plane are reported, not fatal.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    SB_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &ctl_));
    MPI_Comm_set_errhandler(ctl_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(ctl_, &rank_);
    MPI_Comm_size(ctl_, &size_);
    set_error_rank(size_ > 1 ? rank_ : -1);
    MPI_Comm node = MPI_COMM_NULL;
    SB_MPI_CHECK(MPI_Comm_split_type(ctl_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
    MPI_Comm_rank(node, &local_rank_);
    MPI_Comm_size(node, &local_size_);
    MPI_Comm_free(&node);
    char h[256] = {};
    gethostname(h, sizeof h - 1);
    host_ = h;
    library_ = mpi_library();
    launcher_ = detect_launcher();
    if (launcher_.empty()) launcher_ = "single process";
  }
  ~MpiProcessGroup() override {
    MPI_Comm_free(&ctl_);
    MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string launcher() const override { return launcher_; }
  std::string host() const override { return host_; }
  std::string library() const override { return library_; }
  bool is_mpi() const override { return true; }

  void barrier(Deadline d) override {
    MPI_Request req;
    SB_MPI_CHECK(MPI_Ibarrier(ctl_, &req));
    wait_request(req, d, "barrier");
  }
  std::vector<double> allgather(double v, Deadline d) override {
    std::vector<double> out(static_cast<std::size_t>(size_));
    MPI_Request req;
    SB_MPI_CHECK(MPI_Iallgather(&v, 1, MPI_DOUBLE, out.data(), 1, MPI_DOUBLE, ctl_, &req));
    wait_request(req, d, "allgather");
    return out;
  }
  std::vector<std::int64_t> allgather(std::int64_t v, Deadline d) override {
    std::vector<std::int64_t> out(static_cast<std::size_t>(size_));
    MPI_Request req;
    SB_MPI_CHECK(MPI_Iallgather(&v, 1, MPI_INT64_T, out.data(), 1, MPI_INT64_T, ctl_, &req));
    wait_request(req, d, "allgather");
    return out;
  }
  std::string broadcast(const std::string& bytes, int root, Deadline d) override {
    std::int64_t n = static_cast<std::int64_t>(bytes.size());
    MPI_Request req;
    SB_MPI_CHECK(MPI_Ibcast(&n, 1, MPI_INT64_T, root, ctl_, &req));
    wait_request(req, d, "broadcast");
    std::string out = rank_ == root ? bytes : std::string(static_cast<std::size_t>(n), '\0');
    if (n > 0) {
      SB_MPI_CHECK(MPI_Ibcast(out.data(), static_cast<int>(n), MPI_BYTE, root, ctl_, &req));
      wait_request(req, d, "broadcast");
    }
    return out;
  }
  std::vector<std::string> gather(const std::string& bytes, int root, Deadline d) override {
    const int n = static_cast<int>(bytes.size());
    std::vector<int> lens(static_cast<std::size_t>(size_)), offs(static_cast<std::size_t>(size_));
    MPI_Request req;
    SB_MPI_CHECK(MPI_Igather(&n, 1, MPI_INT, lens.data(), 1, MPI_INT, root, ctl_, &req));
    wait_request(req, d, "gather");
    std::string all;
    if (rank_ == root) {
      int total = 0;
      for (int r = 0; r < size_; ++r) offs[r] = total, total += lens[r];
      all.resize(static_cast<std::size_t>(total));
    }
    SB_MPI_CHECK(MPI_Igatherv(bytes.data(), n, MPI_BYTE, all.data(), lens.data(), offs.data(), MPI_BYTE, root, ctl_,
                              &req));
    wait_request(req, d, "gather");
    std::vector<std::string> out;
    if (rank_ == root)
      for (int r = 0; r < size_; ++r) out.push_back(all.substr(static_cast<std::size_t>(offs[r]), lens[r]));
    return out;
  }
  [[noreturn]] void abort(int code) noexcept override {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    _exit(code);  // MPI_Abort returned: end this process at least
  }

 private:
  MPI_Comm ctl_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::string host_, library_, launcher_;
};

// bf16 has no MPI datatype: it travels as MPI_UINT16_T, and reductions use
// user-defined operations that add (or compare) in fp32 and round back, as a
// GPU library reducing bf16 does.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = float_to_bf16_bits(bf16_bits_to_float(a[i]) + bf16_bits_to_float(b[i]));
}
void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *len; ++i)
    if (bf16_bits_to_float(a[i]) > bf16_bits_to_float(b[i])) b[i] = a[i];
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(ProcessGroup& g) : rank_(g.rank()), size_(g.size()), library_(g.library()) {
    SB_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    // A mismatch that truncates a message comes back as an error code from
    // MPI_Test, which the scenario reports; the default handler would abort
    // the job with no dump.
    SB_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    SB_MPI_CHECK(MPI_Op_create(&bf16_sum, 1, &bf16_sum_));
    SB_MPI_CHECK(MPI_Op_create(&bf16_max, 1, &bf16_max_));
  }
  ~MpiCommunicator() override {
    // A call still pending at teardown (only when a hang ended the run) is
    // left alone: freeing or cancelling a nonblocking collective's request
    // is erroneous in MPI, and the job is ending anyway.
    MPI_Op_free(&bf16_sum_);
    MPI_Op_free(&bf16_max_);
    MPI_Comm_free(&comm_);
    for (void* p : buffers_) std::free(p);
  }

  std::string backend() const override { return "mpi"; }
  std::string device() const override { return "host"; }
  std::string library() const override { return library_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool queues_in_order() const override { return false; }

  void* alloc(std::size_t bytes) override {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) throw OutOfMemory(fmt::format("host allocation of {} bytes for MPI buffers failed", bytes));
    buffers_.push_back(p);
    return p;
  }
  void upload(void* dst, const void* host, std::size_t bytes) override { std::memcpy(dst, host, bytes); }
  void download(void* host, const void* src, std::size_t bytes) override { std::memcpy(host, src, bytes); }

  void start(const CollCall& c, const void* send, void* recv) override {
    MPI_Request req = MPI_REQUEST_NULL;
    const MPI_Datatype t = type(c.dtype);
    const MPI_Op op = reduce_op(c);
    const CollCounts n = coll_counts(c, size_);
    const int per = static_cast<int>(c.count / size_);
    const int count = static_cast<int>(c.count);
    switch (c.op) {
      case CollOp::all_reduce: SB_MPI_CHECK(MPI_Iallreduce(send, recv, count, t, op, comm_, &req)); break;
      case CollOp::all_gather: SB_MPI_CHECK(MPI_Iallgather(send, per, t, recv, per, t, comm_, &req)); break;
      case CollOp::reduce_scatter:
        SB_MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, static_cast<int>(n.recv), t, op, comm_, &req));
        break;
      case CollOp::broadcast:
        // nccl-tests' broadcast is out of place; MPI's is in place on recv.
        if (rank_ == c.root) std::memcpy(recv, send, static_cast<std::size_t>(c.count) * dtype_size(c.dtype));
        SB_MPI_CHECK(MPI_Ibcast(recv, count, t, c.root, comm_, &req));
        break;
      case CollOp::reduce: SB_MPI_CHECK(MPI_Ireduce(send, recv, count, t, op, c.root, comm_, &req)); break;
      case CollOp::all_to_all: SB_MPI_CHECK(MPI_Ialltoall(send, per, t, recv, per, t, comm_, &req)); break;
    }
    reqs_.push_back(req);
  }

  bool supports_blocking() const override { return true; }

  // The blocking twin of start(), same arguments: what a user's loop calls,
  // and what Open MPI 4.1 serves with coll/tuned (its I-calls go to
  // coll/libnbc, a slower algorithm family on shared memory).
  void run_blocking(const CollCall& c, const void* send, void* recv) override {
    const MPI_Datatype t = type(c.dtype);
    const MPI_Op op = reduce_op(c);
    const CollCounts n = coll_counts(c, size_);
    const int per = static_cast<int>(c.count / size_);
    const int count = static_cast<int>(c.count);
    int rc = MPI_SUCCESS;
    const char* what = "";
    switch (c.op) {
      case CollOp::all_reduce: what = "MPI_Allreduce"; rc = MPI_Allreduce(send, recv, count, t, op, comm_); break;
      case CollOp::all_gather:
        what = "MPI_Allgather";
        rc = MPI_Allgather(send, per, t, recv, per, t, comm_);
        break;
      case CollOp::reduce_scatter:
        what = "MPI_Reduce_scatter_block";
        rc = MPI_Reduce_scatter_block(send, recv, static_cast<int>(n.recv), t, op, comm_);
        break;
      case CollOp::broadcast:
        what = "MPI_Bcast";
        if (rank_ == c.root) std::memcpy(recv, send, static_cast<std::size_t>(c.count) * dtype_size(c.dtype));
        rc = MPI_Bcast(recv, count, t, c.root, comm_);
        break;
      case CollOp::reduce: what = "MPI_Reduce"; rc = MPI_Reduce(send, recv, count, t, op, c.root, comm_); break;
      case CollOp::all_to_all: what = "MPI_Alltoall"; rc = MPI_Alltoall(send, per, t, recv, per, t, comm_); break;
    }
    if (rc != MPI_SUCCESS)
      throw Error(ErrorKind::runtime, fmt::format("MPI collective failed: {} ({})", mpi_name(rc), what));
  }

  Progress poll() override {
    // Nonblocking collectives on one communicator are matched in issue
    // order but may complete in any order: test every one still pending.
    bool all = true;
    for (auto& r : reqs_) {
      if (r == MPI_REQUEST_NULL) continue;
      int flag = 0;
      const int rc = MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        r = MPI_REQUEST_NULL;  // Open MPI frees a request that completed in error
        throw Error(ErrorKind::runtime, fmt::format("MPI collective failed: {}", mpi_name(rc)));
      }
      all = all && flag;
    }
    if (all) {
      reqs_.clear();
      return Progress::done;
    }
    // Posted requests are progressing: MPI has no finer "started" state.
    return Progress::started;
  }

  std::int64_t completed_in_order() const override {
    std::int64_t n = 0;
    while (n < static_cast<std::int64_t>(reqs_.size()) && reqs_[static_cast<std::size_t>(n)] == MPI_REQUEST_NULL) ++n;
    return n;
  }

  void abort() noexcept override {}  // MPI has no per-communicator abort: the group's MPI_Abort ends the job

 private:
  MPI_Datatype type(CommDtype d) const {
    switch (d) {
      case CommDtype::fp32: return MPI_FLOAT;
      case CommDtype::fp64: return MPI_DOUBLE;
      case CommDtype::bf16: return MPI_UINT16_T;
      case CommDtype::i64: return MPI_INT64_T;
    }
    return MPI_DATATYPE_NULL;
  }
  MPI_Op reduce_op(const CollCall& c) const {
    if (c.dtype == CommDtype::bf16) return c.reduce == ReduceOp::sum ? bf16_sum_ : bf16_max_;
    return c.reduce == ReduceOp::sum ? MPI_SUM : MPI_MAX;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::vector<MPI_Request> reqs_;  // started since poll() last said done; null once complete
  MPI_Op bf16_sum_ = MPI_OP_NULL, bf16_max_ = MPI_OP_NULL;
  int rank_, size_;
  std::string library_;
  std::vector<void*> buffers_;
};

}  // namespace

std::string detect_launcher() {
  if (std::getenv("OMPI_COMM_WORLD_SIZE")) return "mpirun";
  if (std::getenv("SLURM_STEP_ID") && std::getenv("SLURM_PROCID")) return "srun";
  if (std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK")) return "mpiexec";
  return "";
}

std::unique_ptr<ProcessGroup> open_mpi_process_group(int* argc, char*** argv) {
  return std::make_unique<MpiProcessGroup>(argc, argv);
}

std::unique_ptr<Communicator> open_mpi_communicator(ProcessGroup& group) {
  return std::make_unique<MpiCommunicator>(group);
}

}  // namespace sb
