// attention: quadratic attention without a fused kernel.
//
// Workload: scaled dot-product attention over Q, K, V [B, H, S, D], forward or
// forward+backward, by two implementations: `naive` materialises the S x S
// score matrix (PyTorch's math path), the fused one does not (`flash`: tiled
// online softmax on cpu; `cudnn`: cuDNN SDPA on cuda).
// FLOPs (docs/DESIGN.md): forward 4*B*H*S^2*D, halved for causal; forward+backward
// = 3.5 x forward (the backward recomputes S, as flash does).
// TFLOP/s = FLOPs / median time / 1e12. Every implementation's output and
// gradients are checked against a double reference on a small shape first.
#include <algorithm>  // std::max
#include <map>        // std::map
#include <set>        // std::set
#include <tuple>      // std::tuple

#include <fmt/format.h>  // fmt::format

#include "harness/attention_check.hpp"  // check_attention
#include "harness/errors.hpp"           // MismatchError, UnsupportedError, OutOfMemory
#include "harness/point_metrics.hpp"    // add_time_and_rate, measurement_info, against_baseline
#include "harness/printer.hpp"          // format_number
#include "harness/scenario.hpp"         // Scenario, ScenarioRun

namespace sb {
namespace {

using json = nlohmann::ordered_json;

double mib(std::size_t b) { return double(b) / double(1 << 20); }

enum class Pass { fwd, fwd_bwd };
constexpr NameTable<Pass, 2> kPassNames{{{{Pass::fwd, "fwd"}, {Pass::fwd_bwd, "fwd+bwd"}}}};

// Everything a point is, read once from its parameters.
struct Settings {
  AttnImpl impl = AttnImpl::naive;
  DType dtype = DType::fp32;
  bool backward = false;
  AttnShape shape;
  double mem_limit_gb = 0;
  int trials = 0;

  static Settings from(const ParamSet& ps) {
    Settings st;
    st.impl = ps.get_choice("impl", kAttnImplNames);
    st.dtype = ps.get_choice("dtype", kDTypeNames);
    st.backward = ps.get_choice("pass", kPassNames) == Pass::fwd_bwd;
    st.shape.batch = ps.get_int("batch");
    st.shape.heads = ps.get_int("heads");
    st.shape.head_dim = ps.get_int("head_dim");
    st.shape.seq = ps.get_int("seq_len");
    st.shape.causal = ps.get_bool("causal");
    st.shape.backward = st.backward;  // a fwd point plans and allocates the forward's buffers only
    st.mem_limit_gb = ps.get_real("mem_limit_gb");
    st.trials = int(ps.get_int("trials"));
    return st;
  }
  std::string where() const {
    return fmt::format("attention {} {} S={} {}", to_string(impl), to_string(dtype), shape.seq,
                       kPassNames.name(backward ? Pass::fwd_bwd : Pass::fwd));
  }
};

class AttentionRun : public ScenarioRun {
 public:
  explicit AttentionRun(RunContext& ctx) : ctx_(ctx) {}

  Point run_point(const ParamSet& ps) override {
    Device& dev = ctx_.device;
    const Settings st = Settings::from(ps);
    const AttnImpl impl = st.impl;
    const DType dt = st.dtype;
    const bool bwd = st.backward;
    const AttnShape& s = st.shape;
    const std::string where = st.where();
    if (auto why = dev.attention_unsupported(impl, dt)) throw UnsupportedError(*why);

    ctx_.progress(where + ": correctness check");
    const AttnCheck& chk = checked(impl, dt, s.causal, bwd);
    if (!chk.ok)
      throw MismatchError(fmt::format("{} {} attention is wrong on {}: {} elements outside tolerance; worst {}[{}] "
                                      "error {:.3g} (tol {:.3g}); {}",
                                      to_string(impl), to_string(dt), dev.info().id, chk.wrong, chk.worst_tensor,
                                      chk.worst_index, chk.worst_err, chk.worst_tol, chk.first_mismatches));

    // The memory cap makes a smaller device: naive's S x S buffers run out first.
    // (Cold timing's eviction buffer is made once per device, before the
    // peak is reset, so that it never counts as this point's memory.)
    if (ctx_.measure.mode == TimingMode::cold) dev.flush_cache();
    dev.set_memory_limit(std::size_t(st.mem_limit_gb * 1e9));
    dev.reset_peak_memory();
    const std::size_t before = dev.memory_stats().in_use;
    ctx_.progress(where + ": allocate");
    std::unique_ptr<AttentionOp> op;
    try {
      op = dev.make_attention(s, impl, dt, 11);
    } catch (...) {
      dev.set_memory_limit(0);
      throw;  // OutOfMemory becomes status oom, with the bytes it needed in the reason
    }
    dev.set_memory_limit(0);

    ctx_.progress(where + ": timing");
    const MeasureConfig cfg = with_min_trials(ctx_.measure, st.trials);
    const Measurement m = measure(
        dev,
        [&] {
          op->forward();
          if (bwd) op->backward();
        },
        cfg);
    // The high-water mark over the run: the eager path allocates as it goes.
    const Device::MemoryStats mem = dev.memory_stats();

    const double flops = attention_flops(s, bwd);
    Point p;
    add_time_and_rate(p, m, flops, "one pass", bwd ? "3.5 x 4*B*H*S^2*D (x0.5 causal)" : "4*B*H*S^2*D (x0.5 causal)");
    p.add({"workspace_mib", mib(op->workspace_bytes()), "MiB", Direction::lower, std::nullopt,
           "what the implementation allocates beyond Q, K, V, O and gradients"});
    p.add({"peak_mib", mib(mem.peak - std::min(mem.peak, before)), "MiB", Direction::lower, std::nullopt,
           fmt::format("device memory high-water mark of this point ({})", mem.source)});
    p.info = json{{"impl_detail", op->impl_detail()}, {"flops", flops}};
    p.info.update(measurement_info(m));
    p.info["check"] = chk.checked ? json{{"worst_tensor", chk.worst_tensor},
                                         {"worst_error", chk.worst_err},
                                         {"tolerance_at_worst", chk.worst_tol}}
                                  : json{{"skipped", "simulated device: nothing is computed"}};
    return p;
  }

  void analyze(Result& r) override {
    // Fused over naive at the same (seq_len, dtype, causal, pass): speedup and memory ratio.
    auto key = [](const Point& p) {
      return fmt::format("{}|{}|{}|{}|{}|{}|{}", p.params.value("seq_len", 0), p.params.value("dtype", ""),
                         p.params.value("causal", false), p.params.value("pass", ""), p.params.value("batch", 0),
                         p.params.value("heads", 0), p.params.value("head_dim", 0));
    };
    std::map<std::string, const Point*> naive_oom;
    for (const auto& p : r.points)
      if (p.params.value("impl", "") == "naive" && p.status == Status::oom) naive_oom[key(p)] = &p;
    struct Best {
      std::int64_t seq = 0;
      double speedup = 0, mem_ratio = 0;
      std::string impl, pass;
    };
    Best best;
    const auto is_naive = [](const Point& p) { return p.params.value("impl", "") == "naive"; };
    against_baseline(r, key, is_naive, [&](Point& p, const Point& naive) {
      const double sp = naive.metric("ms")->value / p.metric("ms")->value;
      const double mr = naive.metric("peak_mib")->value / std::max(1e-9, p.metric("peak_mib")->value);
      p.add({"speedup_vs_naive", sp, "x", Direction::higher, std::nullopt, "naive time / this time, same shape"});
      p.add({"memory_ratio_vs_naive", mr, "x", Direction::higher, std::nullopt,
             "naive peak memory / this peak memory, same shape"});
      const std::int64_t seq = p.params.value("seq_len", std::int64_t(0));
      // The finding is about a fused kernel: naive-prealloc is still naive.
      if (p.params.value("impl", "") != "naive-prealloc" && seq >= best.seq)
        best = Best{seq, sp, mr, p.params.value("impl", ""), p.params.value("pass", "")};
    });
    std::int64_t first_oom = 0;
    for (const auto& p : r.points) {
      if (is_naive(p) || p.params.value("impl", "") == "naive-prealloc" || p.status != Status::ok ||
          !naive_oom.count(key(p)))
        continue;
      const std::int64_t seq = p.params.value("seq_len", std::int64_t(0));
      if (first_oom == 0 || seq < first_oom) first_oom = seq;
    }
    // A forward-only point needs less memory than forward and backward (no
    // saved tensors, no dS): when naive ran out at first_oom for some passes
    // and ran for others, the finding names the pass that did not fit, and
    // the pass of its speedup.
    std::set<std::string> oom_passes, ok_passes;
    for (const auto& p : r.points)
      if (is_naive(p) && p.params.value("seq_len", std::int64_t(0)) == first_oom && first_oom > 0)
        (p.status == Status::oom ? oom_passes : ok_passes).insert(p.params.value("pass", ""));
    const bool by_pass = !oom_passes.empty() && !ok_passes.empty();
    const auto joined = [](const std::set<std::string>& v) {
      std::string out;
      for (const auto& x : v) out += (out.empty() ? "" : ", ") + x;
      return out;
    };
    std::string summary;
    if (best.seq > 0)
      summary = fmt::format("at S={}{} {} is {} and uses {}x less memory than naive", best.seq,
                            by_pass ? fmt::format(" {}", best.pass) : std::string(), best.impl,
                            best.speedup >= 1 ? fmt::format("{:.1f}x faster", best.speedup)
                                              : fmt::format("slower ({:.2f}x naive's speed)", best.speedup),
                            // a whole number from 10x up; under it a tenth (2.358 read "2x", 1.45 "1x")
                            best.mem_ratio >= 10 ? fmt::format("{:.0f}", best.mem_ratio)
                                                 : fmt::format("{:.1f}", best.mem_ratio));
    if (first_oom > 0)
      summary += fmt::format("{}naive{} runs out of memory at S={}, where the fused kernel still runs",
                             summary.empty() ? "" : "; ", by_pass ? fmt::format(" {}", joined(oom_passes)) : std::string(),
                             first_oom);
    if (summary.empty()) return;
    r.findings.push_back({{}, summary,
                          best.seq > 0 ? std::optional<double>(best.speedup) : std::nullopt,
                          json{{"seq_len", best.seq},
                               {"impl", best.impl},
                               {"pass", best.pass},
                               {"speedup", best.speedup},
                               {"memory_ratio", best.mem_ratio},
                               {"naive_oom_at", first_oom},
                               {"naive_oom_passes", oom_passes}}});
  }

 private:
  const AttnCheck& checked(AttnImpl impl, DType dt, bool causal, bool bwd) {
    const auto k = std::make_tuple(impl, dt, causal, bwd);
    auto it = checks_.find(k);
    if (it == checks_.end()) {
      AttnShape small;
      small.batch = 2;
      small.heads = 3;
      small.seq = 37;  // not a multiple of any tile size
      small.head_dim = 32;
      small.causal = causal;
      it = checks_.emplace(k, check_attention(ctx_.device, small, impl, dt, bwd, 2025, ctx_.measure.sync_timeout))
               .first;
    }
    return it->second;
  }

  RunContext& ctx_;
  std::map<std::tuple<AttnImpl, DType, bool, bool>, AttnCheck> checks_;
};

}  // namespace

// A memory cap so small it rounds to no bytes would silently mean "no cap".
void validate_attention_point(const ParamSet& ps, const RunContext&) {
  const double gb = Settings::from(ps).mem_limit_gb;
  if (gb > 0 && gb * 1e9 < double(1 << 20))
    throw UsageError(fmt::format("mem_limit_gb={:g} is under 1 MiB (0 means no cap)", gb));
}

extern const Scenario attention_scenario;
const Scenario attention_scenario{
    "attention",
    "attention without a fused kernel",
    "time, TFLOP/s and working memory of naive vs fused (flash, cuDNN) attention across sequence lengths",
    {
        ParamSpec{.name = "seq_len", .type = ParamType::integer, .default_value = "512,1024,2048,4096",
                  .help = "sequence length S", .unit = "tokens", .min = 16, .max = 1 << 20,
                  .quick_default = "128,256", .gpu_default = "2048,4096,8192,16384"},
        ParamSpec{.name = "impl", .type = ParamType::choice, .default_value = "naive,flash",
                  .help = "naive (eager, op by op: a fresh S x S tensor per op, as a model's eager attention; "
                          "cpu), naive-prealloc (S x S buffers allocated once, scale and mask fused into the "
                          "softmax; cuda's naive is this), flash (tiled, cpu), cudnn (cuDNN SDPA, cuda)",
                  .choices = kAttnImplNames.names(), .gpu_default = "naive,cudnn"},
        ParamSpec{.name = "dtype", .type = ParamType::choice, .default_value = "fp32",
                  .help = "element type of Q, K, V",
                  .choices = kDTypeNames.names({DType::fp32, DType::bf16, DType::fp16}), .gpu_default = "bf16"},
        ParamSpec{.name = "pass", .type = ParamType::choice, .default_value = "fwd,fwd+bwd",
                  .help = "forward only, or forward and backward", .choices = kPassNames.names()},
        ParamSpec{.name = "causal", .type = ParamType::boolean, .default_value = "false",
                  .help = "causal mask (decoder self-attention); FLOPs halve"},
        ParamSpec{.name = "batch", .type = ParamType::integer, .default_value = "1", .help = "batch size",
                  .unit = "sequences", .min = 1, .max = 4096},
        ParamSpec{.name = "heads", .type = ParamType::integer, .default_value = "8", .help = "attention heads",
                  .unit = "heads", .min = 1, .max = 1024, .gpu_default = "16"},
        ParamSpec{.name = "head_dim", .type = ParamType::integer, .default_value = "64", .help = "head dimension D",
                  .unit = "elements", .min = 8, .max = 512, .gpu_default = "128"},
        ParamSpec{.name = "mem_limit_gb", .type = ParamType::real, .default_value = "0",
                  .help = "device memory cap for this point's allocations (0 = none): a smaller device", .unit = "GB",
                  .min = 0, .max = 1e6},
        trials_param("5", "3"),
    },
    [](RunContext& ctx) -> std::unique_ptr<ScenarioRun> { return std::make_unique<AttentionRun>(ctx); },
    false,
    &validate_attention_point,
};

}  // namespace sb
