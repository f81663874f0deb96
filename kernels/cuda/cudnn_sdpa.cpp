// cuDNN SDPA (fused flash attention) on the cuda device, through the
// cudnn-frontend graph API: graph.sdpa for forward (saving the softmax
// statistics, the log-sum-exp, for backward) and graph.sdpa_backward. The only
// file that includes cudnn_frontend.h: it is large, and kept out of every
// other translation unit.
//
// Graphs are built once per (shape, strides, dtype, causal, scale, pass) and
// cached in the device's CudnnSdpa state, beside the one cuDNN handle bound to
// the device's stream. Building a graph (heuristics, plan, possibly a kernel
// compile) takes from milliseconds to seconds, so it happens in
// make_attention, never in a timed call.
//
// Varlen. The device's packed layout is head-major, [1, H, total, D]. cuDNN's
// ragged (THD) offsets describe token-major packing ([total, H, D]: each
// sequence one contiguous block of tokens x heads), which this layout is not,
// and the padding mask needs a [B, H, S_max, D] padded layout. So each
// sequence runs as its own dense problem: a [1, H, len, D] view with head
// stride total*D, one graph per distinct length, one execution per sequence.
#include <algorithm>      // std::max
#include <cstdint>        // std::int64_t, std::uint64_t
#include <exception>      // std::exception
#include <map>            // std::map
#include <memory>         // std::make_shared, std::make_unique
#include <new>            // std::bad_alloc
#include <mutex>          // std::mutex, std::lock_guard
#include <set>            // std::set
#include <span>           // std::span
#include <string>         // std::string
#include <unordered_map>  // std::unordered_map: variant packs
#include <utility>        // std::move
#include <vector>         // std::vector

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"                  // Error, OutOfMemory, UnsupportedError
#include "kernels/cuda/detail/check.hpp"       // SB_CUDA_CHECK, SB_CUDNN_CHECK, SB_CUDNN_FE_CHECK
#include "kernels/cuda/detail/cuda_gemm.hpp"   // kSetupTimeout
#include "kernels/cuda/detail/cudnn_sdpa.hpp"  // AttnContext, AttnTensors, attention_segments

// The frontend's JSON serialization is for saving graphs, which this file
// never does; skipping it keeps the frontend's bundled nlohmann (3.11.3) out
// of a program that uses Debian's (device.hpp), so there is one definition of
// nlohmann::json in the binary.
#define CUDNN_FRONTEND_SKIP_JSON_LIB
#include <cudnn_frontend.h>  // cudnn_frontend::graph::Graph, SDPA_attributes, SDPA_backward_attributes
#include <cudnn_frontend_version.h>  // CUDNN_FRONTEND_{MAJOR,MINOR,PATCH}_VERSION

namespace sb::cuda_detail {

namespace fe = cudnn_frontend;
using GraphPtr = std::shared_ptr<fe::graph::Graph>;

// One cuDNN handle per device, bound to its stream, and the graphs built on it.
class CudnnSdpa {
 public:
  explicit CudnnSdpa(const AttnContext& ctx) : index_(ctx.index) {
    SB_CUDA_CHECK(cudaSetDevice(ctx.index));
    SB_CUDNN_CHECK(cudnnCreate(&handle_));
    try {
      SB_CUDNN_CHECK(cudnnSetStream(handle_, ctx.stream));
    } catch (...) {
      (void)cudnnDestroy(handle_);
      throw;
    }
  }
  ~CudnnSdpa() {
    graphs_.clear();  // plans refer to the handle's context: release them first
    int prev = 0;
    const bool restore = cudaGetDevice(&prev) == cudaSuccess && prev != index_;
    if (restore) (void)cudaSetDevice(index_);
    (void)cudnnDestroy(handle_);
    if (restore) (void)cudaSetDevice(prev);
  }
  CudnnSdpa(const CudnnSdpa&) = delete;
  CudnnSdpa& operator=(const CudnnSdpa&) = delete;

  cudnnHandle_t handle() const { return handle_; }

  // The cached graph for key, or the one build() makes (then cached).
  template <class Build>
  GraphPtr graph(const std::string& key, Build build) {
    const std::lock_guard<std::mutex> lock(mu_);
    auto it = graphs_.find(key);
    if (it != graphs_.end()) return it->second;
    GraphPtr g = build(handle_);
    graphs_.emplace(key, g);
    return g;
  }

 private:
  int index_;
  cudnnHandle_t handle_ = nullptr;
  std::mutex mu_;
  std::map<std::string, GraphPtr> graphs_;
};

namespace {

// Tensor uids of the variant packs (the frontend's samples use the same).
enum Uid : std::int64_t {
  kQ = 1, kK = 2, kV = 3, kO = 4, kStats = 5,
  kDO = 101, kDQ = 102, kDK = 103, kDV = 104,
};

// One graph's problem: [b, h, l, d] views of Q, K, V, O (and their
// gradients) with strides {batch_stride, head_stride, d, 1}; the statistics
// are a packed [b, h, l, 1] fp32 tensor.
struct Problem {
  std::int64_t b, h, l, d, head_stride;
  DType dtype;
  bool causal;
  float scale;
  std::vector<std::int64_t> dim() const { return {b, h, l, d}; }
  std::vector<std::int64_t> stride() const { return {h * head_stride, head_stride, d, 1}; }
  std::string key(const char* pass) const {
    return fmt::format("{} b{} h{} l{} d{} hs{} {} {} scale{:a}", pass, b, h, l, d, head_stride, to_string(dtype),
                       causal ? "causal" : "dense", double(scale));
  }
  std::string str() const {
    return fmt::format("[{}, {}, {}, {}] {}{}", b, h, l, d, to_string(dtype), causal ? " causal" : "");
  }
};

fe::DataType_t fe_type(DType d) {
  switch (d) {
    case DType::bf16: return fe::DataType_t::BFLOAT16;
    case DType::fp16: return fe::DataType_t::HALF;
    default: break;
  }
  throw UnsupportedError("cuDNN has no fp32 SDPA");
}

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name, Uid uid,
                                                    const Problem& p) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(p.dim()).set_stride(p.stride()));
}

std::vector<std::int64_t> stats_dim(const Problem& p) { return {p.b, p.h, p.l, 1}; }
std::vector<std::int64_t> stats_stride(const Problem& p) { return {p.h * p.l, p.l, 1, 1}; }

GraphPtr new_graph(const Problem& p) {
  auto g = std::make_shared<fe::graph::Graph>();
  // Inputs and outputs in bf16/fp16; the softmax and both GEMMs' accumulation
  // in fp32.
  g->set_io_data_type(fe_type(p.dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

// The frontend's steps, each checked; heuristics mode A, as its samples use.
void build_graph(fe::graph::Graph& g, cudnnHandle_t handle, const Problem& p, const char* pass) {
  try {
    SB_CUDNN_FE_CHECK(g.validate());
    SB_CUDNN_FE_CHECK(g.build_operation_graph(handle));
    SB_CUDNN_FE_CHECK(g.create_execution_plans({fe::HeurMode_t::A}));
    SB_CUDNN_FE_CHECK(g.check_support());
    SB_CUDNN_FE_CHECK(g.build_plans());
  } catch (const Error& e) {
    const std::string what = fmt::format("cuDNN SDPA {} {}: {}", pass, p.str(), e.what());
    if (e.kind() == ErrorKind::unsupported) throw UnsupportedError(what);
    if (e.kind() == ErrorKind::oom) throw OutOfMemory(what);
    throw Error(e.kind(), what);
  }
}

// The frontend's own refusals while a graph is described (Graph::sdpa throws std::runtime_error "No suitable
// implementation for given SDPA_attributes") are this shape unsupported here: a skipped point, not an error.
template <class F>
GraphPtr describe(const Problem& p, const char* pass, F&& f) {
  try {
    return f();
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {
    throw UnsupportedError(fmt::format("cuDNN SDPA {} {}: {}", pass, p.str(), e.what()));
  }
}

GraphPtr forward_graph(const Problem& p, cudnnHandle_t handle) {
  return describe(p, "forward", [&] {
    GraphPtr g = new_graph(p);
    auto q = input(*g, "Q", kQ, p);
    auto k = input(*g, "K", kK, p);
    auto v = input(*g, "V", kV, p);
    auto opts = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_attn_scale(p.scale);
    // Causal: key j is visible to query i when j <= i (diagonal at the top left,
    // band right bound 0), as torch's is_causal with equal lengths.
    if (p.causal)
      opts.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
    auto [o, stats] = g->sdpa(q, k, v, opts);
    o->set_output(true).set_uid(kO).set_dim(p.dim()).set_stride(p.stride());
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim(stats_dim(p))
        .set_stride(stats_stride(p));
    build_graph(*g, handle, p, "forward");
    return g;
  });
}

GraphPtr backward_graph(const Problem& p, cudnnHandle_t handle) {
  return describe(p, "backward", [&] {
    GraphPtr g = new_graph(p);
    auto q = input(*g, "Q", kQ, p);
    auto k = input(*g, "K", kK, p);
    auto v = input(*g, "V", kV, p);
    auto o = input(*g, "O", kO, p);
    auto d_o = input(*g, "dO", kDO, p);
    auto stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("Stats")
                               .set_uid(kStats)
                               .set_data_type(fe::DataType_t::FLOAT)
                               .set_dim(stats_dim(p))
                               .set_stride(stats_stride(p)));
    auto opts = fe::graph::SDPA_backward_attributes().set_name("sdpa_backward").set_attn_scale(p.scale);
    if (p.causal)
      opts.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, d_o, stats, opts);
    dq->set_output(true).set_uid(kDQ).set_dim(p.dim()).set_stride(p.stride());
    dk->set_output(true).set_uid(kDK).set_dim(p.dim()).set_stride(p.stride());
    dv->set_output(true).set_uid(kDV).set_dim(p.dim()).set_stride(p.stride());
    build_graph(*g, handle, p, "backward");
    return g;
  });
}

// "cuDNN 9.19.0, cudnn-frontend 1.32.0": the library that runs, and the
// headers built against.
std::string version_text() {
  const std::size_t v = cudnnGetVersion();  // 10000*major + 100*minor + patch (cuDNN 9)
  return fmt::format("cuDNN {}.{}.{}, cudnn-frontend {}.{}.{}", v / 10000, (v / 100) % 100, v % 100,
                     CUDNN_FRONTEND_MAJOR_VERSION, CUDNN_FRONTEND_MINOR_VERSION, CUDNN_FRONTEND_PATCH_VERSION);
}

class CudnnAttention final : public AttentionOp {
 public:
  CudnnAttention(const AttnContext& ctx, std::shared_ptr<CudnnSdpa> cudnn, const AttnShape& shape, DType dtype,
                 std::uint64_t seed)
      : ctx_(ctx),
        cudnn_(std::move(cudnn)),
        shape_(shape),
        dtype_(dtype),
        esize_(std::size_t(storage_bytes(dtype))),
        tensors_(ctx, shape, dtype, seed) {
    const float scale = float(attention_scale(shape));
    const auto segments = attention_segments(shape, ctx.id);
    // Each segment's statistics, [b, h, len] fp32, start 256-byte aligned
    // (as cudaMalloc's own), whatever the lengths before them.
    std::vector<std::int64_t> stats_offset;  // in floats
    std::int64_t stats_floats = 0;
    for (const AttnSegment& s : segments) {
      stats_offset.push_back(stats_floats);
      stats_floats += (s.batch * s.len + 63) / 64 * 64;
    }
    stats_ = ctx_.device->allocate(std::size_t(stats_floats) * sizeof(float), MemKind::device);

    std::int64_t ws = 0;
    std::set<std::int64_t> lengths;
    for (std::size_t i = 0; i < segments.size(); ++i) {
      const AttnSegment& s = segments[i];
      const Problem p{s.batch / shape.heads, shape.heads, s.len, shape.head_dim, s.head_stride, dtype, shape.causal,
                      scale};
      const GraphPtr fwd = cudnn_->graph(p.key("fwd"), [&](cudnnHandle_t h) { return forward_graph(p, h); });
      // A forward-only op (AttnShape::backward false) plans no backward: its graph build and its workspace
      // (on Hopper perhaps an fp32 dQ accumulator: not measured) would be charged to a forward point, and an
      // unsupported backward would skip it.
      const GraphPtr bwd =
          shape.backward ? cudnn_->graph(p.key("bwd"), [&](cudnnHandle_t h) { return backward_graph(p, h); }) : nullptr;
      for (const GraphPtr& g : {fwd, bwd}) {
        if (!g) continue;
        std::int64_t bytes = 0;
        SB_CUDNN_FE_CHECK(g->get_workspace_size(bytes));
        ws = std::max(ws, bytes);
      }
      // This segment's views: its first token, head 0, in each tensor (16-byte
      // aligned, as cuDNN needs, since head_dim is a multiple of 8).
      const std::int64_t tok = s.token_offset * shape.head_dim;
      auto ptr = [&](const Buffer& b) -> void* { return static_cast<char*>(b.data()) + std::size_t(tok) * esize_; };
      void* stats = static_cast<float*>(stats_.data()) + stats_offset[i];
      runs_.push_back(Run{fwd, bwd,
                          {{kQ, ptr(tensors_.q)}, {kK, ptr(tensors_.k)}, {kV, ptr(tensors_.v)},
                           {kO, ptr(tensors_.o)}, {kStats, stats}},
                          {{kQ, ptr(tensors_.q)}, {kK, ptr(tensors_.k)}, {kV, ptr(tensors_.v)},
                           {kO, ptr(tensors_.o)}, {kStats, stats}, {kDO, ptr(tensors_.d_o)},
                           {kDQ, ptr(tensors_.dq)}, {kDK, ptr(tensors_.dk)}, {kDV, ptr(tensors_.dv)}}});
      lengths.insert(s.len);
    }
    if (ws > 0) workspace_ = ctx_.device->allocate(std::size_t(ws), MemKind::device);

    detail_ = fmt::format("cuDNN SDPA, fused flash attention ({}); {} in, fp32 softmax and accumulation",
                          version_text(), to_string(dtype));
    if (shape.varlen())
      detail_ += fmt::format("; one graph execution per sequence ({} sequences, {} distinct lengths)", runs_.size(),
                             lengths.size());
    ctx_.device->synchronize(kSetupTimeout);
  }

  AttnShape shape() const override { return shape_; }
  AttnImpl impl() const override { return AttnImpl::cudnn; }
  DType dtype() const override { return dtype_; }
  std::string impl_detail() const override { return detail_; }
  // The log-sum-exp statistics (B*H*S fp32, each sequence's 256-byte
  // aligned) and cuDNN's workspace.
  std::size_t workspace_bytes() const override { return stats_.bytes() + workspace_.bytes(); }

  void forward() override {
    bind();
    for (Run& r : runs_) SB_CUDNN_FE_CHECK(r.fwd->execute(cudnn_->handle(), r.fwd_pack, workspace_.data()));
  }

  void backward() override {
    if (!shape_.backward)
      throw Error(ErrorKind::runtime, ctx_.id + ": cuDNN attention planned for the forward only (AttnShape::backward)");
    bind();
    for (Run& r : runs_) SB_CUDNN_FE_CHECK(r.bwd->execute(cudnn_->handle(), r.bwd_pack, workspace_.data()));
  }

  void upload(std::span<const float> q, std::span<const float> k, std::span<const float> v,
              std::span<const float> d_o) override {
    tensors_.upload(q, k, v, d_o);
  }
  void download(std::span<float> o, std::span<float> dq, std::span<float> dk, std::span<float> dv) override {
    tensors_.download(o, dq, dk, dv);
  }

 private:
  void bind() const { SB_CUDA_CHECK(cudaSetDevice(ctx_.index)); }

  // One execution per segment; the packs hold device pointers fixed at
  // construction (execute takes them by non-const reference).
  struct Run {
    GraphPtr fwd, bwd;
    std::unordered_map<std::int64_t, void*> fwd_pack, bwd_pack;
  };

  AttnContext ctx_;
  std::shared_ptr<CudnnSdpa> cudnn_;  // keeps the handle alive as long as the op
  AttnShape shape_;
  DType dtype_;
  std::size_t esize_;
  AttnTensors tensors_;
  Buffer stats_, workspace_;
  std::vector<Run> runs_;
  std::string detail_;
};

}  // namespace

std::shared_ptr<CudnnSdpa> make_cudnn_sdpa(const AttnContext& ctx) { return std::make_shared<CudnnSdpa>(ctx); }

std::unique_ptr<AttentionOp> make_cudnn_attention(const AttnContext& ctx, const std::shared_ptr<CudnnSdpa>& cudnn,
                                                  const AttnShape& shape, DType dtype, std::uint64_t seed) {
  // Before anything is allocated: a malformed shape is UsageError, fp32 is
  // UnsupportedError, and so is a head size outside cuDNN's documented
  // fp16/bf16 surface.
  (void)attention_segments(shape, ctx.id);
  (void)fe_type(dtype);
  if (shape.head_dim % 8 != 0 || shape.head_dim > 256)
    throw UnsupportedError(
        fmt::format("cuDNN SDPA needs head_dim a multiple of 8, at most 256 (got {})", shape.head_dim));
  return std::make_unique<CudnnAttention>(ctx, cudnn, shape, dtype, seed);
}

std::string cudnn_frontend_version() {
  return fmt::format("{}.{}.{}", CUDNN_FRONTEND_MAJOR_VERSION, CUDNN_FRONTEND_MINOR_VERSION,
                     CUDNN_FRONTEND_PATCH_VERSION);
}

}  // namespace sb::cuda_detail
