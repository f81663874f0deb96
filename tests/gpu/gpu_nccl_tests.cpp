// backend=nccl on one GPU, one rank (no MPI needed): the communicator's
// bootstrap, every op with the exact check, the fingerprint's i64 max
// all-reduce, several calls in flight on the stream, and abort. Multi-rank
// NCCL runs in tests/scenario/test_collective_mpi.py --backend nccl (two
// GPUs). Own main: with no GPU it prints why and exits 77 (SKIP).
#include <gtest/gtest.h>

#include <chrono>   // std::chrono
#include <cstring>  // std::memcpy
#include <thread>   // std::this_thread

#include "harness/comm.hpp"                // make_single_process_group, Communicator
#include "harness/errors.hpp"              // Error
#include "tests/gpu/gpu_main.hpp"          // gpu_test_main: SKIP (77) without a device
#include "kernels/cuda/nccl_comm.hpp"      // open_nccl_communicator
#include "scenarios/collective/coll_data.hpp"  // fill_coll_input, count_coll_wrong

namespace sb {
namespace {

using clock_type = std::chrono::steady_clock;

// Polls to done with a deadline: a test never hangs.
void wait_done(Communicator& c) {
  const auto deadline = clock_type::now() + std::chrono::seconds(60);
  while (c.poll() != Communicator::Progress::done) {
    ASSERT_LT(clock_type::now(), deadline) << "collective did not complete in 60 s";
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

class Nccl : public testing::Test {
 protected:
  void SetUp() override {
    group_ = make_single_process_group();
    comm_ = open_nccl_communicator(*group_, clock_type::now() + std::chrono::seconds(60));
  }
  std::unique_ptr<ProcessGroup> group_;
  std::unique_ptr<Communicator> comm_;
};

TEST_F(Nccl, EveryOpIsExactOnOneRank) {
  EXPECT_EQ(comm_->backend(), "nccl");
  EXPECT_EQ(comm_->device(), "cuda:0");
  for (CollOp op : all_coll_ops())
    for (CommDtype d : {CommDtype::fp32, CommDtype::fp64, CommDtype::bf16}) {
      const CollCall c{op, 1 << 16, d};
      const std::size_t bytes = static_cast<std::size_t>(c.count) * dtype_size(d);
      void* send = comm_->alloc(bytes);
      void* recv = comm_->alloc(bytes);
      std::vector<unsigned char> host;
      fill_coll_input(c, 1, 0, 42, host);
      comm_->upload(send, host.data(), host.size());
      comm_->start(c, send, recv);
      wait_done(*comm_);
      std::vector<unsigned char> got(static_cast<std::size_t>(coll_counts(c, 1).recv) * dtype_size(d));
      comm_->download(got.data(), recv, got.size());
      EXPECT_EQ(count_coll_wrong(c, 1, 0, 42, got), 0) << to_string(op) << " " << to_string(d);
    }
}

TEST_F(Nccl, CallsQueueOnTheStreamAndTheFingerprintReduces) {
  EXPECT_TRUE(comm_->queues_in_order());
  const std::int64_t v[2] = {1234567, -1234567};
  void* send = comm_->alloc(sizeof v);
  void* recv = comm_->alloc(sizeof v);
  comm_->upload(send, v, sizeof v);
  for (int i = 0; i < 50; ++i) comm_->start(CollCall{CollOp::all_reduce, 2, CommDtype::i64, 0, ReduceOp::max}, send, recv);
  wait_done(*comm_);
  std::int64_t r[2];
  comm_->download(r, recv, sizeof r);
  EXPECT_EQ(r[0], v[0]);
  EXPECT_EQ(r[1], v[1]);
}

TEST_F(Nccl, AbortEndsTheCommunicator) {
  comm_->abort();
  comm_->abort();  // twice is harmless: the watchdog and the main thread may both get there
  EXPECT_THROW(comm_->poll(), Error);
}

}  // namespace
}  // namespace sb

int main(int argc, char** argv) { return sb::gpu_test_main(argc, argv); }
