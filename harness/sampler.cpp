#include "harness/sampler.hpp"

#include <algorithm>  // std::clamp

namespace sb {

Sampler::Sampler(std::unique_ptr<UtilProbe> probe, std::chrono::milliseconds period)
    : probe_(std::move(probe)),
      source_(probe_ ? probe_->source() : "none"),
      period_(period.count() > 0 ? period : probe_ ? probe_->period() : std::chrono::milliseconds(10)) {}

Sampler::~Sampler() { stop(); }

void Sampler::start() {
  if (!probe_ || thread_.joinable()) return;
  probe_->sample();  // start the probe's window now
  thread_ = std::thread([this] { loop(); });
}

void Sampler::stop() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::vector<TimedSample> Sampler::series() const {
  std::lock_guard lk(mu_);
  return series_;
}

void Sampler::loop() {
  const auto t0 = std::chrono::steady_clock::now();
  auto next = t0 + period_;
  std::unique_lock lk(mu_);
  while (!cv_.wait_until(lk, next, [&] { return stop_; })) {
    lk.unlock();
    UtilSample s;
    try {
      s = probe_->sample();
    } catch (const std::exception& e) {  // e.g. NVML lost the device: keep what we have
      lk.lock();
      error_ = e.what();
      return;
    }
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    lk.lock();
    series_.push_back(TimedSample{t, s});
    next += period_;
    const auto now = std::chrono::steady_clock::now();
    if (next < now) next = now + period_;  // fell behind: do not burst
  }
}

Pattern classify(std::span<const double> u, bool progressed) {
  if (!progressed) return Pattern::stuck;
  if (u.empty()) return Pattern::idle;
  double sum = 0;
  std::size_t low = 0, high = 0;
  for (double x : u) {
    sum += x;
    low += x <= 0.2;
    high += x >= 0.8;
  }
  const double n = double(u.size());
  const double mean = sum / n;
  if (mean < 0.05) return Pattern::idle;
  if (mean >= 0.90) return Pattern::healthy;
  if (double(low) / n >= 0.15 && double(high) / n >= 0.15) return Pattern::spiky;
  return Pattern::steady_low;
}

std::string sparkline(std::span<const double> u, std::size_t width) {
  static const char* blocks[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  std::string out;
  if (u.empty() || width == 0) return out;
  // A longer series shows its middle `width` samples as they are: averaging
  // would flatten the spikes this line is there to show, and picking every
  // k-th sample aliases against the step period.
  const std::size_t n = std::min(width, u.size());
  const std::size_t first = (u.size() - n) / 2;
  for (std::size_t i = first; i < first + n; ++i) {
    const double v = std::clamp(u[i], 0.0, 1.0);
    out += blocks[std::min<std::size_t>(7, std::size_t(v * 8))];
  }
  return out;
}

}  // namespace sb
