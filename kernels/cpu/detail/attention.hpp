// The cpu device's attention: what the naive (oneDNN matmul + C++ softmax)
// and flash (tiled online softmax in C++) implementations share: the shape's
// sequences, operand storage and its transfers, the ledger checks, and the
// small vectorisable math (exp, bf16) their loops use.
//
// Storage: Q, K, V, dO in the op's dtype (fp32, or bf16 as raw 16-bit
// patterns); O, dQ, dK, dV in fp32 for both dtypes (accumulation is fp32, and
// a bf16 gradient would only add a rounding the check has to forgive).
#pragma once

#include <bit>       // std::bit_cast
#include <cstddef>   // std::size_t
#include <cstdint>   // std::int64_t, std::uint16_t, std::uint32_t
#include <memory>    // std::shared_ptr, std::unique_ptr
#include <optional>  // std::optional
#include <span>      // std::span
#include <string>    // std::string
#include <vector>    // std::vector

#include <fmt/format.h>            // fmt::format
#include <oneapi/dnnl/dnnl.hpp>  // dnnl::engine

#include "harness/device.hpp"                     // AttentionOp, AttnShape, AttnImpl
#include "harness/dtype.hpp"                      // DType
#include "kernels/cpu/detail/compute_stream.hpp"  // ComputeStream
#include "kernels/cpu/detail/mem_ledger.hpp"      // MemLedger, LedgerBlock
#include "kernels/cpu/detail/vec_math.hpp"        // exp_v

namespace sb::cpu {

// What a cpu device hands an attention op: its engine, its stream (the
// compute thread everything runs on) and its memory ledger.
struct AttnEnv {
  dnnl::engine& eng;
  ComputeStream& cs;
  std::shared_ptr<MemLedger> ledger;
};

// One sequence of the shape: rows [start, start+len) of the token axis of
// batch entry b. Dense: B sequences of S tokens; varlen: one per segment of
// cu_seqlens, all in batch entry 0. Every (sequence, head) is independent.
struct AttnSeq {
  std::int64_t b = 0, start = 0, len = 0;
};

// Validates the shape (UsageError naming the problem) and lists its sequences.
std::vector<AttnSeq> attn_sequences(const AttnShape& s);
// Tokens per (batch, head) slab: S dense, cu_seqlens.back() varlen.
inline std::int64_t attn_tokens(const AttnShape& s) { return s.varlen() ? s.cu_seqlens.back() : s.seq; }
double attn_scale(const AttnShape& s);
// "fp32 B=1 H=8 S=4096 D=64 causal": what messages and labels show.
std::string attn_label(const AttnShape& s, DType t);

// Seeds of the four inputs; attention_check.cpp draws its inputs the same way.
inline std::uint64_t attn_input_seed(std::uint64_t seed, int which /*0 q, 1 k, 2 v, 3 dO*/) {
  return seed * 4 + std::uint64_t(which);
}

// ---- small math the kernels inline ----

inline float ld(const float* p) { return *p; }
inline float ld(const std::uint16_t* p) { return std::bit_cast<float>(std::uint32_t(*p) << 16); }  // bf16 -> fp32 is exact
inline void st(float* p, float x) { *p = x; }
// Round to nearest even; inputs here are finite, so no NaN case.
inline void st(std::uint16_t* p, float x) {
  const std::uint32_t b = std::bit_cast<std::uint32_t>(x);
  *p = std::uint16_t((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

// exp: vec_math.hpp's exp_v (Cephes' polynomial, vectorises). It is 0 below
// -86.6, as exp(lowest - max) of a masked score is: the clamp to -87.3 this
// had before gave masked entries 1e-38, and P 1e-40 after normalising, a
// subnormal, so fp32 eager causal attention's GEMMs and softmax backward ran
// on subnormal operands: 60 ms at S=256, H=4, against 1.4 ms not causal.

// The part of an attention op both implementations share.
class CpuAttention : public AttentionOp {
 public:
  // Checks operands + workspace_bytes against the ledger first (OutOfMemory
  // with `workspace_what` spelled out), then allocates and fills the operands.
  CpuAttention(const AttnEnv& env, const AttnShape& s, AttnImpl impl, DType t, std::uint64_t seed,
               std::size_t workspace_bytes, const std::string& workspace_what);

  AttnShape shape() const override { return shape_; }
  AttnImpl impl() const override { return impl_; }
  DType dtype() const override { return dtype_; }
  std::size_t workspace_bytes() const override { return workspace_bytes_; }
  void forward() override;
  void backward() override;
  void upload(std::span<const float> q, std::span<const float> k, std::span<const float> v,
              std::span<const float> d_o) override;
  void download(std::span<float> o, std::span<float> dq, std::span<float> dk, std::span<float> dv) override;

  // Bytes of Q, K, V, dO in t and O, dQ, dK, dV in fp32.
  static std::size_t operand_bytes(const AttnShape& s, DType t);

 protected:
  // Run on the compute thread.
  virtual void run_forward() = 0;
  virtual void run_backward() = 0;
  // Every derived destructor calls this first: the op's forward or backward
  // may still be queued or running on the stream (an owner dropped the op
  // without synchronizing, as a GPU framework may), and it uses this
  // object's members; wait for it before any member goes. After a
  // timed-out wait the queued ones were dropped, the running one is waited
  // out (the harness watchdog bounds the process).
  void finish_running_work() {
    if (!env_.ledger->keeps_freed_blocks()) {
      try {
        env_.cs.wait_done(last_seq_, std::chrono::minutes(10));
        return;
      } catch (...) {  // a hang: keep what the running item may still use
        env_.ledger->keep_freed_blocks();
      }
    }
    env_.cs.drain(std::chrono::hours(1));
  }
  // Workspace the derived op allocates, accounted under this op's label.
  LedgerBlock alloc_workspace(std::size_t bytes, const char* name);
  bool bf16() const { return dtype_ == DType::bf16; }
  // Names a phase of the running forward or backward for --trace (its own
  // kernel there, with the dtype: "gemm S=QK^T fp32", "softmax_warp_forward fp32").
  void mark(const char* phase) const {
    if (stream_marking()) stream_mark(fmt::format("{} {}", phase, to_string(dtype_)));
  }
  // Element offset of row `row` of sequence `q`, head h, in any [B,H,T,D] tensor.
  std::int64_t row_offset(const AttnSeq& q, std::int64_t h, std::int64_t row) const {
    return ((q.b * shape_.heads + h) * tokens_ + q.start + row) * shape_.head_dim;
  }

  AttnEnv env_;
  AttnShape shape_;
  AttnImpl impl_;
  DType dtype_;
  std::vector<AttnSeq> seqs_;
  std::int64_t tokens_ = 0;        // T
  std::size_t elems_ = 0;          // B*H*T*D, the size of every operand
  float scale_ = 1;
  std::size_t workspace_bytes_ = 0;
  std::uint64_t last_seq_ = 0;  // the stream item of the last forward or backward
  std::string label_;              // "naive attention fp32 B=1 H=8 S=4096 D=64"
  LedgerBlock q_, k_, v_, do_;     // dtype
  LedgerBlock o_, dq_, dk_, dv_;   // fp32
};

std::optional<std::string> attention_unsupported(dnnl::engine& eng, AttnImpl impl, DType t);
// Throws UsageError (bad shape), UnsupportedError, OutOfMemory (the ledger).
std::unique_ptr<AttentionOp> make_attention(const AttnEnv& env, const AttnShape& s, AttnImpl impl, DType t,
                                            std::uint64_t seed);
// eager: `naive` (op by op, fresh tensors); otherwise `naive-prealloc`.
std::unique_ptr<AttentionOp> make_naive_attention(const AttnEnv& env, const AttnShape& s, DType t, std::uint64_t seed,
                                                  bool eager);
std::unique_ptr<AttentionOp> make_flash_attention(const AttnEnv& env, const AttnShape& s, DType t,
                                                  std::uint64_t seed);

}  // namespace sb::cpu
