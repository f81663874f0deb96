#include "harness/comm.hpp"

#include <unistd.h>  // _exit, gethostname

#include <array>   // std::array
#include <cstdio>  // std::fflush

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"  // UnsupportedError

namespace sb {


const std::vector<CollOp>& all_coll_ops() {
  static const std::vector<CollOp> v = [] {
    const auto ops = kCollOpNames.values();
    return std::vector<CollOp>(ops.begin(), ops.end());
  }();
  return v;
}

std::size_t dtype_size(CommDtype d) {
  switch (d) {
    case CommDtype::fp32: return 4;
    case CommDtype::fp64: return 8;
    case CommDtype::bf16: return 2;
    case CommDtype::i64: return 8;
  }
  return 0;
}

bool is_rooted(CollOp op) { return op == CollOp::broadcast || op == CollOp::reduce; }

bool reduces(CollOp op) { return op == CollOp::all_reduce || op == CollOp::reduce || op == CollOp::reduce_scatter; }

std::string describe(const CollCall& c) {
  std::string s = fmt::format("{} count={} {}", to_string(c.op), c.count, to_string(c.dtype));
  if (reduces(c.op)) s += fmt::format(" {}", to_string(c.reduce));
  if (is_rooted(c.op)) s += fmt::format(" root={}", c.root);
  return s;
}

void Communicator::run_blocking(const CollCall& c, const void*, void*) {
  throw UnsupportedError(fmt::format("backend {} has no blocking collectives ({}): start() and poll() them",
                                     backend(), describe(c)));
}

std::int64_t round_count(CollOp op, std::int64_t count, int nranks) {
  if (count < 1) count = 1;
  switch (op) {
    case CollOp::all_gather:
    case CollOp::reduce_scatter:
    case CollOp::all_to_all: return count < nranks ? nranks : count - count % nranks;
    default: return count;
  }
}

CollCounts coll_counts(const CollCall& c, int n) {
  switch (c.op) {
    case CollOp::all_reduce:
    case CollOp::broadcast:
    case CollOp::reduce: return {c.count, c.count};
    case CollOp::all_gather: return {c.count / n, c.count};
    case CollOp::reduce_scatter: return {c.count, c.count / n};
    case CollOp::all_to_all: return {c.count, c.count};
  }
  return {};
}

double bus_factor(CollOp op, int n) {
  if (n <= 1) return 0.0;
  switch (op) {
    case CollOp::all_reduce: return 2.0 * (n - 1) / n;
    case CollOp::all_gather:
    case CollOp::reduce_scatter:
    case CollOp::all_to_all: return static_cast<double>(n - 1) / n;
    case CollOp::broadcast:
    case CollOp::reduce: return 1.0;
  }
  return 0.0;
}

namespace {
class SingleProcessGroup final : public ProcessGroup {
 public:
  SingleProcessGroup() {
    char h[256] = {};
    gethostname(h, sizeof h - 1);
    host_ = h;
  }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::string launcher() const override { return "single process (built without MPI)"; }
  std::string host() const override { return host_; }
  std::string library() const override { return "none"; }
  void barrier(Deadline) override {}
  std::vector<double> allgather(double v, Deadline) override { return {v}; }
  std::vector<std::int64_t> allgather(std::int64_t v, Deadline) override { return {v}; }
  std::string broadcast(const std::string& bytes, int, Deadline) override { return bytes; }
  std::vector<std::string> gather(const std::string& bytes, int, Deadline) override { return {bytes}; }
  [[noreturn]] void abort(int code) noexcept override {
    std::fflush(nullptr);
    _exit(code);
  }

 private:
  std::string host_;
};
}  // namespace

std::unique_ptr<ProcessGroup> make_single_process_group() { return std::make_unique<SingleProcessGroup>(); }

}  // namespace sb
