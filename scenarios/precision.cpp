// precision: training in fp32 where bf16 would do.
//
// Workload: one GEMM C[M,N] = A[M,K] W[N,K]^T (an nn.Linear forward) per dtype
// and size. GEMM FLOPs = 2*M*N*K; TFLOP/s = FLOPs / median seconds per GEMM / 1e12.
// Each dtype is checked against a double-precision reference before it is timed;
// a mismatch is an error, not a figure.
#include <algorithm>  // std::max
#include <map>        // std::map

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"      // MismatchError, UnsupportedError
#include "harness/gemm_check.hpp"  // check_gemm
#include "harness/point_metrics.hpp"  // add_time_and_rate, measurement_info, against_baseline
#include "harness/printer.hpp"     // format_number
#include "harness/scenario.hpp"    // Scenario, ScenarioRun

namespace sb {
namespace {

using json = nlohmann::ordered_json;

json check_info(const GemmCheck& c) {
  if (!c.checked) return json{{"skipped", "simulated device: nothing is computed"}};
  return json{{"shape", fmt::format("{}x{}x{}", c.shape.m, c.shape.n, c.shape.k)},
              {"worst_error_over_tolerance", c.worst_ratio},
              {"impl", c.impl}};
}

// Everything a point is, read once from its parameters.
struct Settings {
  GemmShape shape;
  DType dtype = DType::fp32;
  TimingMode timing = TimingMode::warm;
  int trials = 0;

  static Settings from(const ParamSet& ps) {
    const std::int64_t size = ps.get_int("size");
    const auto or_size = [&](const char* k) { return ps.get_int(k) == 0 ? size : ps.get_int(k); };
    return {GemmShape{or_size("m"), or_size("n"), or_size("k")}, ps.get_choice("dtype", kDTypeNames),
            ps.get_choice("timing", kTimingModeNames), int(ps.get_int("trials"))};
  }
  std::string where() const {
    return fmt::format("precision {}x{}x{} {}", shape.m, shape.n, shape.k, to_string(dtype));
  }
};

class PrecisionRun : public ScenarioRun {
 public:
  explicit PrecisionRun(RunContext& ctx) : ctx_(ctx) {}

  Point run_point(const ParamSet& ps) override {
    const Settings st = Settings::from(ps);
    const GemmShape& s = st.shape;
    const DType t = st.dtype;
    const std::string where = st.where();
    Device& dev = ctx_.device;
    if (auto why = dev.gemm_unsupported(t)) throw UnsupportedError(*why);

    ctx_.progress(where + ": correctness check");
    const GemmCheck& chk = checked(t);
    if (!chk.ok)
      throw MismatchError(fmt::format("{} GEMM is wrong on {}: {} of {} elements outside tolerance ({}x{}x{}); {}",
                                      to_string(t), dev.info().id, chk.wrong, chk.shape.m * chk.shape.n, chk.shape.m,
                                      chk.shape.n, chk.shape.k, chk.first_mismatches));

    // configure: nothing is allocated inside the timed region
    ctx_.progress(where + ": allocate");
    auto op = dev.make_gemm(s, t, 42);
    MeasureConfig cfg = with_min_trials(ctx_.measure, st.trials);
    cfg.mode = st.timing;
    // timed window
    ctx_.progress(where + ": timing");
    const Measurement m = measure(dev, [&] { op->enqueue(); }, cfg);

    // derive
    Point p;
    const double flops = s.flops();
    add_time_and_rate(p, m, flops, "one GEMM", "2*M*N*K");
    if (ctx_.expected) {
      if (auto peak = ctx_.expected->peak_tflops(t)) {
        p.add({"pct_of_peak", 100.0 * p.metric("tflops")->value / peak->first, "%", Direction::higher, std::nullopt,
               fmt::format("of {} {} TFLOP/s, {}", ctx_.expected->id(), format_number(peak->first), peak->second)});
      }
    }
    p.info = json{{"m", s.m},
                  {"n", s.n},
                  {"k", s.k},
                  {"flops", flops},
                  {"impl", op->impl()},
                  {"c_dtype", to_string(op->c_dtype())}};
    p.info.update(measurement_info(m));
    p.info["check"] = check_info(chk);
    return p;
  }

  void analyze(Result& r) override {
    // speedup_vs_fp32: measured in this run, at the same shape.
    // Same shape and same timing mode: a cold bf16 figure is never divided by a warm fp32 one.
    auto key = [](const Point& p) {
      const std::string mode = p.params.value("timing", "warm");
      return fmt::format("{}x{}x{}{}", p.info.value("m", 0), p.info.value("n", 0), p.info.value("k", 0),
                         mode == "warm" ? "" : " (" + mode + ")");
    };
    bool any_fp32 = false;
    for (const auto& p : r.points) any_fp32 |= p.status == Status::ok && p.params.value("dtype", "") == "fp32";
    struct Best {
      double speedup = 0;
      std::string shape;
      double fp32 = 0, other = 0;
      double flops = -1;  // of the shape: the largest one wins
    };
    std::map<std::string, Best> best;  // per dtype: at the largest shape that has both
    against_baseline(
        r, key, [](const Point& p) { return p.params.value("dtype", "") == "fp32"; },
        [&](Point& p, const Point& base) {
          const double fp32 = base.metric("tflops")->value;
          if (fp32 <= 0) return;
          const double tf = p.metric("tflops")->value;
          const double sp = tf / fp32;
          p.add({"speedup_vs_fp32", sp, "x", Direction::higher, std::nullopt, "TFLOP/s over fp32 at the same shape"});
          Best& b = best[p.params.value("dtype", "")];
          const double flops = p.info.value("flops", 0.0);
          if (flops >= b.flops) b = Best{sp, key(p), fp32, tf, flops};
        });
    if (!any_fp32) {
      r.findings.push_back({{}, "no fp32 point ran, so no gain over fp32 can be measured",
                            std::nullopt, json::object()});
      return;
    }
    const std::string dev = r.meta.value("/device/id"_json_pointer, std::string("this device"));
    if (best.empty()) {
      // fp32 ran and nothing else did: say so, rather than print no finding at all.
      std::string why;
      for (const auto& p : r.points)
        if (p.status != Status::ok && p.params.value("dtype", "") == "bf16" && !p.reason.empty()) {
          why = " (bf16: " + p.reason + ")";
          break;
        }
      r.findings.push_back({{},
                            fmt::format("only fp32 ran on {}, so no gain over it can be measured here{}", dev, why),
                            std::nullopt, json::object()});
      return;
    }
    for (const char* dt : {"bf16", "fp16", "tf32", "fp8_e4m3"}) {
      auto it = best.find(dt);
      if (it == best.end()) continue;
      const Best& b = it->second;
      std::string extra;
      if (std::string(dt) == "tf32") extra = " (PyTorch: torch.backends.cuda.matmul.allow_tf32 = True; off by default since 1.12)";
      if (std::string(dt) == "fp8_e4m3") extra = " (needs scaling recipes, e.g. Transformer Engine)";
      r.findings.push_back({{},
                            fmt::format("fp32 -> {}: {:.1f}x on {} at {} ({} -> {} TFLOP/s){}", dt, b.speedup, dev,
                                        b.shape, format_number(b.fp32), format_number(b.other), extra),
                            b.speedup,
                            json{{"shape", b.shape},
                                 {"fp32_tflops", b.fp32},
                                 {std::string(dt) + "_tflops", b.other},
                                 {"dtype", dt}}});
    }
  }

 private:
  const GemmCheck& checked(DType t) {
    auto it = checks_.find(t);
    if (it == checks_.end())
      it = checks_.emplace(t, check_gemm(ctx_.device, t, gemm_check_shape(t), 2024, ctx_.measure.sync_timeout)).first;
    return it->second;
  }

  RunContext& ctx_;
  std::map<DType, GemmCheck> checks_;
};

}  // namespace

extern const Scenario precision_scenario;
const Scenario precision_scenario{
    "precision",
    "fp32 where bf16 would do",
    "GEMM TFLOP/s per dtype (fp32, tf32, bf16, fp16, fp8), % of peak and speedup over fp32",
    {
        ParamSpec{.name = "size",
                  .type = ParamType::integer,
                  .default_value = "1024,2048",
                  .help = "square GEMM size: M = N = K unless m, n or k is given",
                  .unit = "elements",
                  .min = 16,
                  .max = 65536,
                  .quick_default = "256,512",
                  .gpu_default = "1024,2048,4096,8192",
                  .moot_when_given = {"m", "n", "k"}},
        ParamSpec{.name = "m", .type = ParamType::integer, .default_value = "0",
                  .help = "rows of A and C (tokens); 0 = size", .unit = "elements", .min = 0, .max = 65536},
        ParamSpec{.name = "n", .type = ParamType::integer, .default_value = "0",
                  .help = "rows of W, columns of C (output features); 0 = size", .unit = "elements", .min = 0,
                  .max = 65536},
        ParamSpec{.name = "k", .type = ParamType::integer, .default_value = "0",
                  .help = "reduction length (input features); 0 = size", .unit = "elements", .min = 0, .max = 65536},
        ParamSpec{.name = "dtype",
                  .type = ParamType::choice,
                  .default_value = "fp32,tf32,bf16,fp16,fp8_e4m3",
                  .help = "element type; a device without one records the point as skipped",
                  .choices = kDTypeNames.names()},
        ParamSpec{.name = "timing",
                  .type = ParamType::choice,
                  .default_value = "warm",
                  .help = "warm: back to back on the same operands; cold: L2/LLC flushed before each GEMM; "
                          "hidden: a trial queued behind a held stream (no launch gaps)",
                  .choices = kTimingModeNames.names()},
        trials_param("10", "3"),
    },
    [](RunContext& ctx) -> std::unique_ptr<ScenarioRun> { return std::make_unique<PrecisionRun>(ctx); },
};

}  // namespace sb
